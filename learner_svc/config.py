"""Settings of learner_svc, read from the environment by ``python -m learner_svc``.

Three modes, each with its own settings class so none carries another's fields:

* ``PODIUM_LEARNER_MODE=swarm``: the learning loop (:class:`LoopSettings`, this module) with
  the swarm algorithm (:class:`learner_svc.algorithms.swarm.SwarmSettings`);
* ``rollout``: the rollout controller, the one writer of the rollout registry
  (:class:`learner_svc.rollout.config.ControllerSettings`, ``PODIUM_ROLLOUT_*``);
* ``stats`` (default): an observer that only accounts for what it receives (:class:`LearnerConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from podium import topics
from podium.config import ServiceConfig, env, non_negative_int, positive_int
from podium.errors import ConfigError

MODES = ("stats", "swarm", "rollout")
"""``PODIUM_LEARNER_MODE`` values."""


def learner_mode(raw: str) -> str:
    """One of :data:`MODES`."""
    value = raw.strip().lower()
    if value not in MODES:
        raise ValueError(f"expected one of {', '.join(MODES)}")
    return value


@dataclass(frozen=True)
class LearnerConfig(ServiceConfig):
    """learner_svc settings every mode has (plus the shared ones of
    :class:`podium.config.ServiceConfig`)."""

    mode: str = env("PODIUM_LEARNER_MODE", default="stats", parse=learner_mode)
    """``stats``: account for scored trajectories only; ``swarm``: run the learning loop with
    the swarm algorithm (train the orchestrator's policy and publish its versions);
    ``rollout``: run the rollout controller (offline check, shadow, staged rollout,
    RolloutService)."""
    group_id: str = env("PODIUM_GROUP_ID", default="learner")
    """Consumer group of the learner on the scored-trajectory topic."""
    batch_max: int = env("PODIUM_BATCH_MAX", default=100, parse=positive_int)
    """Most scored trajectories fetched (and, in stats mode, committed) at once."""
    log_every: int = env("PODIUM_LEARNER_LOG_EVERY", default=1, parse=positive_int)
    """Stats mode: log a summary line every this many trajectories."""


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """Settings of the learning loop (the algorithm has its own)."""

    checkpoint_dir: Path
    """Where ``checkpoint.json`` and its tensor file live (one learner per directory)."""
    topic: str = topics.SCORED_TRAJECTORIES
    """Topic of scored trajectories to consume."""
    policy_topic: str = topics.POLICY_UPDATES
    """Topic to announce new versions on."""
    group_id: str = "learner"
    """Consumer group (its committed offsets trail the checkpoint's, never lead them)."""
    client_id: str = "learner_svc"
    """Client id / producer name on the bus."""
    batch_trajectories: int = 16
    """Usable trajectories per update."""
    max_policy_lag: int = 2
    """η: trajectories whose acting policy is more than this many versions old are dropped."""
    publish_every: int = 1
    """Publish a new policy version every this many updates."""
    fetch_max: int = 100
    """Most records fetched at once."""
    fetch_timeout_s: float = 0.5
    """How long one fetch waits for records."""
    idle_flush_s: float = 0.0
    """Train on a partial batch after this long without new records (0: only full batches)."""
    keep_ledger: bool = True
    """Keep every trained trajectory id in the checkpoint (proof of exactly-once; grows with
    the stream, so production deployments may turn it off and keep the counters only)."""
    dedupe_updates: int = 64
    """Remember the trajectory ids of this many latest updates (in the checkpoint, so across
    restarts) and drop a record whose id is among them: defence in depth against duplicates
    upstream, in bounded memory (``dedupe_updates × batch_trajectories`` ids)."""
    log_dir: Path | None = None
    """TensorBoard directory, or None."""
    rollout_topic: str = ""
    """The rollout registry to follow (``podium.rollout.v1``): reset to the live version when
    the rollout rejects the lineage being trained (:mod:`learner_svc.lineage`); empty: train
    one lineage and never reset (``podium train``, demos)."""
    trusted_keys: str = ""
    """Public keys (``PODIUM_POLICY_TRUSTED_KEYS`` syntax) whose announcements a reset also
    accepts, besides the learner's own signing key; empty: its own only."""

    def __post_init__(self) -> None:
        for name in ("batch_trajectories", "publish_every", "fetch_max", "dedupe_updates"):
            if getattr(self, name) < 1:
                raise ConfigError(f"LoopConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_policy_lag < 0:
            raise ConfigError(f"LoopConfig.max_policy_lag must be >= 0, got {self.max_policy_lag}")


@dataclass(frozen=True)
class LoopSettings:
    """The learning loop's settings (``PODIUM_LEARNER_MODE=swarm``)."""

    checkpoint_dir: str = env("PODIUM_LEARNER_CHECKPOINT_DIR")
    """Where the atomic checkpoint (weights, optimizer, offsets) lives."""
    batch_trajectories: int = env("PODIUM_LEARNER_BATCH", default=32, parse=positive_int)
    """On-policy trajectories per update (one new version each)."""
    max_policy_lag: int = env("PODIUM_LEARNER_MAX_LAG", default=2, parse=non_negative_int)
    """η: trajectories of a version more than this many versions old are dropped."""
    tensorboard_dir: str = env("PODIUM_LEARNER_TB", default="")
    """TensorBoard log directory; empty = none."""
    keep_ledger: bool = env("PODIUM_LEARNER_KEEP_LEDGER", default=True)
    """Keep every trained trajectory id in the checkpoint (the proof of exactly-once; it grows
    with the stream, so a long-lived deployment may turn it off and keep the counters)."""
    dedupe_updates: int = env("PODIUM_LEARNER_DEDUPE_UPDATES", default=64, parse=positive_int)
    """Updates whose trajectory ids the learner remembers (across restarts) and refuses to
    train on again; duplicates are dropped and counted (``skipped_duplicate``)."""
    idle_flush_s: float = env("PODIUM_LEARNER_IDLE_FLUSH_S", default=0.0)
    """Train on a partial batch after this many seconds without new records (0: only full
    batches, as ``podium train`` needs; a live deployment with a trickle of sessions sets it)."""
    in_topic: str = env("PODIUM_LEARNER_IN_TOPIC", default=topics.SCORED_TRAJECTORIES)
    """Scored trajectories to learn from."""
    policy_topic: str = env("PODIUM_LEARNER_POLICY_TOPIC", default=topics.POLICY_UPDATES)
    """Where new versions are announced."""
    rollout_topic: str = env("PODIUM_LEARNER_ROLLOUT_TOPIC", default="")
    """The rollout registry to follow (``podium.rollout.v1`` where a rollout controller runs):
    when the rollout rejects the lineage being trained, the learner resets to the live
    version's weights; empty: never reset (one lineage, as ``podium train`` wants)."""
    trusted_keys: str = env("PODIUM_POLICY_TRUSTED_KEYS", default="")
    """Extra public keys a reset accepts announcements from (comma-separated PEM files or
    directories), besides the learner's own key: the old key during a rotation."""

    def __post_init__(self) -> None:
        if not self.checkpoint_dir:
            raise ConfigError("PODIUM_LEARNER_CHECKPOINT_DIR: the learning loop needs a directory")

    def loop_config(self, service: LearnerConfig, client_id: str) -> LoopConfig:
        """The :class:`LoopConfig` these settings and the service's shared ones give."""
        return LoopConfig(
            checkpoint_dir=Path(self.checkpoint_dir),
            topic=self.in_topic,
            policy_topic=self.policy_topic,
            group_id=service.group_id,
            client_id=client_id,
            batch_trajectories=self.batch_trajectories,
            max_policy_lag=self.max_policy_lag,
            fetch_max=service.batch_max,
            keep_ledger=self.keep_ledger,
            dedupe_updates=self.dedupe_updates,
            idle_flush_s=self.idle_flush_s,
            log_dir=Path(self.tensorboard_dir) if self.tensorboard_dir else None,
            rollout_topic=self.rollout_topic,
            trusted_keys=self.trusted_keys,
        )
