"""``python -m learner_svc``: the learner process (configured from the environment)."""

from __future__ import annotations

from learner_svc.app import SERVICE, LearnerApp
from learner_svc.config import LearnerConfig
from podium.bus import connect
from podium.bus.base import Bus
from podium.config import from_env
from podium.service import App, default_instance_name, run_standalone, setup_logging
from podium.telemetry import setup_tracing


def load() -> tuple[App, Bus]:
    """Config from the environment (fails fast naming the variable), then the app."""
    config = from_env(LearnerConfig)
    setup_logging(config.log_level)
    provider = setup_tracing(SERVICE, set_global=True)
    bus = connect(config.bus_url)
    if config.mode == "swarm":
        # Imported here: torch and the policy network are only needed in this mode.
        from learner_svc.swarm import SwarmLearnerApp

        instance = config.instance or default_instance_name(SERVICE)
        return SwarmLearnerApp(config, bus, instance=instance), bus
    return LearnerApp(config, bus, tracer_provider=provider), bus


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
