"""Shared fixtures: the event bus under test and the Kafka broker it may talk to.

``bus`` is parametrized over both implementations, so every test that uses it is a contract
test: ``[inproc]`` always runs; ``[kafka]`` needs a real broker named by
``$PODIUM_KAFKA_BOOTSTRAP`` (start one with ``scripts/kafka.sh start``). Without it the Kafka
cases are skipped when run by hand, and fail under CI (``CI=true``), where a missing broker is
a broken pipeline rather than an optional extra.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from podium.bus import Bus, InProcBus, KafkaBus, KafkaConfig

KAFKA_ENV = "PODIUM_KAFKA_BOOTSTRAP"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``host:port`` of the real broker, or skip (by hand) / fail (CI) when there is none."""
    bootstrap = os.environ.get(KAFKA_ENV, "").strip()
    if not bootstrap:
        if _in_ci():
            pytest.fail(f"CI=true but ${KAFKA_ENV} is not set: CI must start a broker first")
        pytest.skip(f"no Kafka broker: set ${KAFKA_ENV} (see scripts/kafka.sh start)")
    return bootstrap


def kafka_test_config(bootstrap: str, **overrides: object) -> KafkaConfig:
    """Kafka settings tuned for tests: fast heartbeats so rebalances settle in about a second."""
    settings: dict[str, object] = {
        "client_id": "podium-tests",
        "heartbeat_interval_ms": 250,
        "session_timeout_ms": 6000,  # the broker's group.min.session.timeout.ms default
        "revoke_grace_s": 3.0,
        "join_timeout_s": 30.0,
    }
    settings.update(overrides)
    return KafkaConfig(bootstrap, **settings)  # type: ignore[arg-type]


@pytest.fixture
def kafka_config() -> Callable[..., KafkaConfig]:
    """``kafka_config(bootstrap, **overrides)``: test-tuned settings (see kafka_test_config)."""
    return kafka_test_config


@pytest.fixture(params=["inproc", pytest.param("kafka", marks=pytest.mark.kafka)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    """A started bus of each implementation; stopped after the test."""
    impl: Bus
    if request.param == "inproc":
        impl = InProcBus()
    else:
        impl = KafkaBus(kafka_test_config(request.getfixturevalue("kafka_bootstrap")))
    await impl.start()
    try:
        yield impl
    finally:
        await impl.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique topic/group names, so tests sharing a broker never see each other's records."""
    run = uuid.uuid4().hex[:10]

    def make(prefix: str) -> str:
        return f"test.{prefix}.{run}.{uuid.uuid4().hex[:6]}"

    return make
