"""reward_svc settings, read once from environment variables into a frozen dataclass.

A missing required variable or a bad value stops the service at start-up with a
:class:`~podium.errors.ConfigError` naming the variable, before it touches the bus.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from podium import topics
from podium.config import log_level
from podium.errors import ConfigError

ENV_PREFIX = "PODIUM_REWARD_"


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How reward_svc connects, what it reads and writes, and how it batches."""

    bus_url: str
    """``PODIUM_BUS`` (required): ``kafka://HOST:PORT[,HOST:PORT][?options]`` or ``inproc://``."""
    reward_config: str = ""
    """``PODIUM_REWARD_CONFIG``: reward config YAML; empty means the packaged default."""
    in_topic: str = topics.TRAJECTORIES
    """``PODIUM_REWARD_IN_TOPIC``: trajectories to score."""
    out_topic: str = topics.SCORED_TRAJECTORIES
    """``PODIUM_REWARD_OUT_TOPIC``: where scored trajectories go."""
    group_id: str = "reward_svc"
    """``PODIUM_REWARD_GROUP``: consumer group shared by all replicas."""
    transactional_id: str = "reward_svc-0"
    """``PODIUM_REWARD_TRANSACTIONAL_ID``: stable per replica, so a restarted replica fences
    its previous incarnation and aborts the transaction it left open."""
    instance: str = ""
    """``PODIUM_REWARD_INSTANCE``: name stamped on produced envelopes (default reward_svc/host)."""
    max_batch: int = 100
    """``PODIUM_REWARD_MAX_BATCH``: most records per transaction."""
    poll_timeout_ms: int = 500
    """``PODIUM_REWARD_POLL_MS``: longest wait for records; bounds the reaction to SIGTERM."""
    fixed_progress: float | None = None
    """``PODIUM_REWARD_PROGRESS``: score every trajectory at this training progress instead of
    deriving it from the acting policy's version."""
    record_delay_ms: int = 0
    """``PODIUM_REWARD_RECORD_DELAY_MS``: artificial pause per record inside a transaction.
    Fault-injection tests use it to hold a transaction open long enough to kill the process
    inside it; always 0 in production."""
    partitions: int = 3
    """``PODIUM_REWARD_PARTITIONS``: partitions of the output topics when the service creates them."""
    log_level: str = "INFO"
    """``PODIUM_LOG_LEVEL`` (shared by every service): DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    shutdown_timeout_s: float = 30.0
    """``PODIUM_SHUTDOWN_TIMEOUT_S`` (shared by every service): how long a graceful stop may
    take to finish the batch in hand. A batch cut off after that is left uncommitted (on Kafka:
    its transaction is never committed), so it is scored again by the next owner, never lost."""

    @property
    def producer_name(self) -> str:
        """Name stamped as ``Envelope.producer``."""
        return self.instance or f"reward_svc/{socket.gethostname()}"

    @property
    def is_kafka(self) -> bool:
        """Whether the bus is Kafka (exactly-once path) rather than in-process."""
        return self.bus_url.startswith("kafka://")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    return value


def from_env(env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read :class:`ServiceConfig` from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    bus = env.get("PODIUM_BUS", "").strip()
    if not bus:
        raise ConfigError(
            "PODIUM_BUS: not set; expected kafka://HOST:PORT[,HOST:PORT] or inproc://"
        )
    if not (bus.startswith("kafka://") or bus.startswith(("inproc://", "memory://"))):
        raise ConfigError(f"PODIUM_BUS: expected kafka://HOST:PORT or inproc://, got {bus!r}")
    if bus.startswith("kafka://") and not bus.removeprefix("kafka://").split("?")[0]:
        raise ConfigError(f"PODIUM_BUS: kafka:// needs HOST:PORT, got {bus!r}")
    progress_raw = env.get(f"{ENV_PREFIX}PROGRESS", "")
    fixed: float | None = None
    if progress_raw:
        try:
            fixed = float(progress_raw)
        except ValueError:
            raise ConfigError(
                f"{ENV_PREFIX}PROGRESS: expected a number, got {progress_raw!r}"
            ) from None
        if not math.isfinite(fixed) or fixed < 0:
            raise ConfigError(f"{ENV_PREFIX}PROGRESS: must be a finite number >= 0, got {fixed}")
    level_raw = env.get("PODIUM_LOG_LEVEL", "") or "INFO"
    try:
        level = log_level(level_raw)
    except ValueError as exc:
        raise ConfigError(f"PODIUM_LOG_LEVEL: {exc}, got {level_raw!r}") from None
    timeout_raw = env.get("PODIUM_SHUTDOWN_TIMEOUT_S", "")
    timeout = 30.0
    if timeout_raw:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise ConfigError(
                f"PODIUM_SHUTDOWN_TIMEOUT_S: expected a number of seconds, got {timeout_raw!r}"
            ) from None
        if not math.isfinite(timeout) or timeout <= 0:
            raise ConfigError(f"PODIUM_SHUTDOWN_TIMEOUT_S: must be > 0, got {timeout_raw!r}")
    cfg_path = env.get(f"{ENV_PREFIX}CONFIG", "")
    if cfg_path and not os.path.isfile(cfg_path):
        raise ConfigError(f"{ENV_PREFIX}CONFIG: no such file {cfg_path!r}")
    names: dict[str, str] = {}
    for field_name, var, default in (
        ("in_topic", "IN_TOPIC", topics.TRAJECTORIES),
        ("out_topic", "OUT_TOPIC", topics.SCORED_TRAJECTORIES),
        ("group_id", "GROUP", "reward_svc"),
        ("transactional_id", "TRANSACTIONAL_ID", "reward_svc-0"),
    ):
        value = env.get(f"{ENV_PREFIX}{var}", default)
        if not value.strip():
            raise ConfigError(f"{ENV_PREFIX}{var}: must not be empty")
        names[field_name] = value
    return ServiceConfig(
        bus_url=bus,
        reward_config=cfg_path,
        instance=env.get(f"{ENV_PREFIX}INSTANCE", ""),
        max_batch=_int(env, f"{ENV_PREFIX}MAX_BATCH", 100, 1),
        poll_timeout_ms=_int(env, f"{ENV_PREFIX}POLL_MS", 500, 1),
        fixed_progress=fixed,
        record_delay_ms=_int(env, f"{ENV_PREFIX}RECORD_DELAY_MS", 0, 0),
        partitions=_int(env, f"{ENV_PREFIX}PARTITIONS", 3, 1),
        log_level=level,
        shutdown_timeout_s=timeout,
        **names,
    )
