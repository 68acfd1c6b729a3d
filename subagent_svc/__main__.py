"""``python -m subagent_svc``: one sub-agent worker process (configured from the environment)."""

from __future__ import annotations

from podium.bus import connect
from podium.bus.base import Bus
from podium.config import from_env
from podium.service import App, run_standalone, setup_logging
from podium.telemetry import setup_tracing
from subagent_svc.app import SERVICE, SubagentApp
from subagent_svc.config import SubagentConfig


def load() -> tuple[App, Bus]:
    """Config from the environment (fails fast naming the variable), then the app."""
    config = from_env(SubagentConfig)
    setup_logging(config.log_level)
    provider = setup_tracing(SERVICE, set_global=True)
    bus = connect(config.bus_url)
    return SubagentApp(config, bus, tracer_provider=provider), bus


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
