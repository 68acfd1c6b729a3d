"""``python -m orchestrator_svc``: the orchestrator process (configured from the environment).

Settings come from ``OrchestratorConfig`` (fails fast, exit 2, naming the variable); the
process serves SessionService (with its own health) on ``PODIUM_GRPC_PORT`` and
``grpc.health.v1`` on ``PODIUM_HEALTH_PORT``, and stops gracefully on SIGTERM
(:func:`podium.service.run_standalone`).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from orchestrator_svc.app import OrchestratorApp
from orchestrator_svc.config import SERVICE, OrchestratorConfig
from podium.bus.base import Bus
from podium.service import run_standalone, standalone_loader


def build(config: OrchestratorConfig, bus: Bus, provider: TracerProvider) -> OrchestratorApp:
    """The orchestrator app for ``config`` on ``bus``."""
    return OrchestratorApp(config, bus, tracer_provider=provider)


load = standalone_loader(SERVICE, OrchestratorConfig, build)
"""Config from the environment, then logging, tracing, the bus and the app."""


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
