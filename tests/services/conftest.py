"""Fixtures of the service tests (helpers live in svc_helpers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from svc_helpers import run_stack

from podium.bus import InProcBus


@pytest.fixture
async def inproc_bus() -> AsyncIterator[InProcBus]:
    bus = InProcBus()
    await bus.start()
    try:
        yield bus
    finally:
        await bus.stop()


@pytest.fixture
def stack_factory() -> Callable[..., Any]:
    """``async with stack_factory(bus, ...) as stack:`` (see :func:`run_stack`)."""
    return run_stack
