"""``python -m subagent_svc``: one sub-agent worker process (configured from the environment).

Settings come from ``SubagentConfig`` (fails fast, exit 2, naming the variable); the process
serves ``grpc.health.v1`` on ``PODIUM_HEALTH_PORT`` and stops gracefully on SIGTERM
(:func:`podium.service.run_standalone`).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from podium.bus.base import Bus
from podium.service import run_standalone, standalone_loader
from subagent_svc.app import SERVICE, SubagentApp
from subagent_svc.config import SubagentConfig


def build(config: SubagentConfig, bus: Bus, provider: TracerProvider) -> SubagentApp:
    """The worker app for ``config`` on ``bus``."""
    return SubagentApp(config, bus, tracer_provider=provider)


load = standalone_loader(SERVICE, SubagentConfig, build)
"""Config from the environment, then logging, tracing, the bus and the app."""


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
