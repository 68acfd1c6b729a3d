"""Settings of learner_svc, read from the environment by ``python -m learner_svc``."""

from __future__ import annotations

from dataclasses import dataclass

from podium.config import ServiceConfig, env, positive_float, positive_int
from podium.errors import ConfigError

MODES = ("stats", "swarm")
"""``PODIUM_LEARNER_MODE`` values."""


def learner_mode(raw: str) -> str:
    """One of :data:`MODES`."""
    value = raw.strip().lower()
    if value not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}")
    return value


def non_negative_int(raw: str) -> int:
    """An integer >= 0."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError("expected an integer") from None
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


@dataclass(frozen=True)
class LearnerConfig(ServiceConfig):
    """learner_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    group_id: str = env("PODIUM_GROUP_ID", default="learner")
    """Consumer group of the learner on the scored-trajectory topic."""
    batch_max: int = env("PODIUM_BATCH_MAX", default=100, parse=positive_int)
    """Most scored trajectories fetched (and committed) at once."""
    log_every: int = env("PODIUM_LEARNER_LOG_EVERY", default=1, parse=positive_int)
    """Log a summary line every this many trajectories."""
    mode: str = env("PODIUM_LEARNER_MODE", default="stats", parse=learner_mode)
    """``stats``: account for scored trajectories only; ``swarm``: train the orchestrator's
    swarm policy with PPO and publish its versions (:mod:`learner_svc.swarm`)."""
    artifacts_dir: str = env("PODIUM_LEARNER_ARTIFACTS", default="")
    """Swarm mode (required): root of published versions,
    ``<root>/swarm_policy/<version>/weights.safetensors``; orchestrators must be able to read it."""
    checkpoint_dir: str = env("PODIUM_LEARNER_CHECKPOINT_DIR", default="")
    """Swarm mode (required): where the atomic checkpoint (weights, optimizer, offsets) lives."""
    init: str = env("PODIUM_LEARNER_INIT", default="")
    """Swarm mode: a swarm policy (safetensors, e.g. a behaviour-cloning result) to start from
    as version 0 when there is no checkpoint; empty = a freshly initialised network."""
    batch_trajectories: int = env("PODIUM_LEARNER_BATCH", default=32, parse=positive_int)
    """Swarm mode: on-policy trajectories per PPO update (one new version each)."""
    max_policy_lag: int = env("PODIUM_LEARNER_MAX_LAG", default=2, parse=non_negative_int)
    """Swarm mode: η, trajectories of a version more than this many versions old are dropped."""
    learning_rate: float = env("PODIUM_LEARNER_LR", default=3e-4, parse=positive_float)
    """Swarm mode: Adam learning rate at the start of the cosine schedule."""
    learning_rate_end: float = env("PODIUM_LEARNER_LR_END", default=3e-5, parse=positive_float)
    """Swarm mode: learning rate at the end of the schedule."""
    total_updates: int = env("PODIUM_LEARNER_TOTAL_UPDATES", default=100, parse=positive_int)
    """Swarm mode: updates over which the learning-rate and entropy schedules run."""
    seed: int = env("PODIUM_LEARNER_SEED", default=0, parse=non_negative_int)
    """Swarm mode: seed of a fresh network and of the minibatch shuffling."""
    max_subtasks: int = env("PODIUM_LEARNER_MAX_SUBTASKS", default=64, parse=positive_int)
    """Swarm mode: environment slot count S stored with each version (orchestrators run its
    sessions with the same S)."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Swarm mode: pool spec file (JSON/YAML); empty = the shipped default. Must be the pool the
    orchestrator schedules for (the action layout depends on its agents)."""
    tensorboard_dir: str = env("PODIUM_LEARNER_TB", default="")
    """Swarm mode: TensorBoard log directory; empty = none."""
    model_repository: str = env("PODIUM_MODEL_REPOSITORY", default="")
    """Swarm mode: Triton model repository to export every published version >= 1 into
    (``<repo>/swarm_policy/<version>/model.onnx``, announced as ``onnx_uri`` /
    ``onnx_sha256``), for orchestrators with a served backend; empty = no export. The
    KServe-V2 server must serve this directory, and those orchestrators read it too."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "swarm":
            missing = [
                var
                for var, value in (
                    ("PODIUM_LEARNER_ARTIFACTS", self.artifacts_dir),
                    ("PODIUM_LEARNER_CHECKPOINT_DIR", self.checkpoint_dir),
                )
                if not value
            ]
            if missing:
                raise ConfigError(
                    f"PODIUM_LEARNER_MODE=swarm needs {' and '.join(missing)} (a directory)"
                )
