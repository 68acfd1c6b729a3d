"""``python -m learner_svc``: the learner process (configured from the environment)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from learner_svc.app import SERVICE, LearnerApp
from learner_svc.config import LearnerConfig
from podium.bus import connect
from podium.bus.base import Bus
from podium.config import from_env
from podium.service import App, default_instance_name, run_standalone, setup_logging
from podium.telemetry import setup_tracing

if TYPE_CHECKING:
    from learner_svc.loop import LearningLoop


def load() -> tuple[App, Bus]:
    """Config from the environment (fails fast naming the variable), then the app."""
    config = from_env(LearnerConfig)
    setup_logging(config.log_level)
    provider = setup_tracing(SERVICE, set_global=True)
    bus = connect(config.bus_url)
    if config.mode == "rollout":
        return rollout_app(config, bus), bus
    if config.mode == "swarm":
        from learner_svc.loop import LoopApp  # torch: only this mode needs it

        return LoopApp(swarm_loop(config, bus), shutdown_timeout_s=config.shutdown_timeout_s), bus
    return LearnerApp(config, bus, tracer_provider=provider), bus


def rollout_app(config: LearnerConfig, bus: Bus) -> App:
    """The rollout controller, configured from the environment (``PODIUM_ROLLOUT_*``)."""
    from learner_svc.rollout.app import RolloutApp  # torch (twins): only this mode needs it
    from learner_svc.rollout.config import ControllerSettings

    return RolloutApp(
        from_env(ControllerSettings),
        bus,
        instance=config.instance or default_instance_name(SERVICE),
        shutdown_timeout_s=config.shutdown_timeout_s,
    )


def swarm_loop(config: LearnerConfig, bus: Bus) -> LearningLoop[Any]:
    """The learning loop with the swarm algorithm, both configured from the environment."""
    from learner_svc.algorithms.swarm import SwarmPPO, SwarmSettings
    from learner_svc.config import LoopSettings
    from learner_svc.loop import LearningLoop

    loop_settings = from_env(LoopSettings)
    algorithm = SwarmPPO.from_settings(from_env(SwarmSettings))
    instance = config.instance or default_instance_name(SERVICE)
    return LearningLoop(loop_settings.loop_config(config, instance), algorithm, bus)


if __name__ == "__main__":
    raise SystemExit(run_standalone(SERVICE, load))
