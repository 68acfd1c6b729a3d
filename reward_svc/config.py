"""Settings of reward_svc, read from the environment by ``python -m reward_svc``.

The shared settings (``PODIUM_BUS``, ``PODIUM_INSTANCE``, ``PODIUM_LOG_LEVEL``,
``PODIUM_TOPIC_PARTITIONS``, ``PODIUM_SHUTDOWN_TIMEOUT_S``) come from
:class:`podium.config.ServiceConfig`, like every service's; the reward-specific ones are
``PODIUM_REWARD_*``. ``from_env(RewardServiceConfig)`` reports every missing or invalid
variable by name before anything connects.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from podium import topics
from podium.config import ServiceConfig, env, non_negative_int, positive_int
from podium.service import default_instance_name

SERVICE = "reward_svc"
"""Service name (logs, the default instance and consumer group)."""


def existing_file(raw: str) -> str:
    """A path to a file that exists (checked at start-up, not at first use)."""
    if not os.path.isfile(raw):
        raise ValueError(f"no such file {raw!r}")
    return raw


def progress(raw: str) -> float:
    """A training progress: a finite number >= 0."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite number >= 0")
    return value


def not_blank(raw: str) -> str:
    """A name that is not just whitespace (topic, group, transactional id prefix)."""
    if not raw.strip():
        raise ValueError("must not be blank")
    return raw


RETIRED_TRANSACTIONAL_ID = "PODIUM_REWARD_TRANSACTIONAL_ID"
"""The per-replica transactional id of old; replaced by a per-group prefix."""


def retired_transactional_id(raw: str) -> str:
    """Refuse the retired per-replica transactional id: taken as a prefix, a per-replica value
    would stop replicas fencing each other, the very thing exactly-once needs."""
    if raw:
        raise ValueError(
            "is no longer read: set PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX instead, the SAME "
            "for every replica of the group (transactional ids are now per input partition)"
        )
    return raw


@dataclass(frozen=True)
class RewardServiceConfig(ServiceConfig):
    """reward_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    reward_config: str = env("PODIUM_REWARD_CONFIG", default="", parse=existing_file)
    """Reward config YAML; empty means the packaged default."""
    in_topic: str = env("PODIUM_REWARD_IN_TOPIC", default=topics.TRAJECTORIES, parse=not_blank)
    """Trajectories to score."""
    out_topic: str = env(
        "PODIUM_REWARD_OUT_TOPIC", default=topics.SCORED_TRAJECTORIES, parse=not_blank
    )
    """Where scored trajectories go."""
    group_id: str = env("PODIUM_REWARD_GROUP", default=SERVICE, parse=not_blank)
    """Consumer group shared by all replicas."""
    transactional_id_prefix: str = env(
        "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX", default="", parse=not_blank
    )
    """Prefix of the per-input-partition transactional ids (``prefix.topic.partition``): the
    same for every replica of the group and stable across restarts, so whichever replica owns
    a partition next fences the one that owned it before; different between groups reading
    the same topic. Empty = the group id."""
    retired_transactional_id: str = env(
        RETIRED_TRANSACTIONAL_ID, default="", parse=retired_transactional_id
    )
    """Always empty: setting the retired variable is a configuration error naming its
    replacement."""
    max_attempts: int = env("PODIUM_REWARD_MAX_ATTEMPTS", default=5, parse=positive_int)
    """Tries of a trajectory whose scoring keeps failing with retriable errors before it goes
    to the dead-letter topic with the error (poison never stops the service)."""
    max_batch: int = env("PODIUM_REWARD_MAX_BATCH", default=100, parse=positive_int)
    """Most records per transaction."""
    poll_timeout_ms: int = env("PODIUM_REWARD_POLL_MS", default=500, parse=positive_int)
    """Longest wait for records; bounds the reaction to SIGTERM."""
    fixed_progress: float | None = env("PODIUM_REWARD_PROGRESS", default=None, parse=progress)
    """Score every trajectory at this training progress instead of deriving it from the
    acting policy's version."""
    record_delay_ms: int = env("PODIUM_REWARD_RECORD_DELAY_MS", default=0, parse=non_negative_int)
    """Artificial pause per record inside a transaction. Fault-injection tests use it to hold a
    transaction open long enough to kill the process inside it; always 0 in production."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.transactional_id_prefix:
            # Resolved once, here, so every reader (the loop, the fencing message) agrees.
            object.__setattr__(self, "transactional_id_prefix", self.group_id)

    @property
    def producer_name(self) -> str:
        """Name stamped as ``Envelope.producer`` and on dead letters."""
        return self.instance or default_instance_name(SERVICE)
