"""Settings of learner_svc, read from the environment by ``python -m learner_svc``."""

from __future__ import annotations

from dataclasses import dataclass

from podium.config import ServiceConfig, env, positive_int


@dataclass(frozen=True)
class LearnerConfig(ServiceConfig):
    """learner_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    group_id: str = env("PODIUM_GROUP_ID", default="learner")
    """Consumer group of the learner on the scored-trajectory topic."""
    batch_max: int = env("PODIUM_BATCH_MAX", default=100, parse=positive_int)
    """Most scored trajectories fetched (and committed) at once."""
    log_every: int = env("PODIUM_LEARNER_LOG_EVERY", default=1, parse=positive_int)
    """Log a summary line every this many trajectories."""
