"""``python -m orchestrator_svc``: the orchestrator process (configured from the environment)."""

from __future__ import annotations

from orchestrator_svc.app import SERVICE, OrchestratorApp
from orchestrator_svc.config import OrchestratorConfig
from podium.bus import connect
from podium.bus.base import Bus
from podium.config import from_env
from podium.service import App, run_standalone, setup_logging
from podium.telemetry import setup_tracing


def load() -> tuple[App, Bus]:
    """Config from the environment (fails fast naming the variable), then the app."""
    config = from_env(OrchestratorConfig)
    setup_logging(config.log_level)
    provider = setup_tracing(SERVICE, set_global=True)
    bus = connect(config.bus_url)
    return OrchestratorApp(config, bus, tracer_provider=provider), bus


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
