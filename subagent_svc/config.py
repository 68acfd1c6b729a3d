"""Settings of subagent_svc, read from the environment by ``python -m subagent_svc``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from podium.config import ServiceConfig, env, non_negative_float, positive_int


def unix_time(raw: str) -> float:
    """A finite number of seconds since the Unix epoch, >= 0."""
    value = non_negative_float(raw)
    if not math.isfinite(value):
        raise ValueError("expected a finite unix time in seconds")
    return value


@dataclass(frozen=True)
class SubagentConfig(ServiceConfig):
    """subagent_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    group_id: str = env("PODIUM_GROUP_ID", default="subagent")
    """Consumer group of the workers; every process in it shares the assignment partitions."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Pool spec file (JSON/YAML) of the simulated sub-agents; empty = the shipped default.
    Must be the same pool the orchestrator schedules for."""
    batch_max: int = env("PODIUM_BATCH_MAX", default=50, parse=positive_int)
    """Most assignments fetched (and committed) at once."""
    concurrency: int = env("PODIUM_SUBAGENT_CONCURRENCY", default=1, parse=positive_int)
    """Members of the worker group in this process. Each member executes its partitions' assignments
    one after another, so up to this many run at once (bounded by the partitions of the
    assignment topic, which are spread over every member of the group), sharing one process's
    loaded plug-ins (an index and its embedding model loaded once, not once per process)."""
    time_scale: float = env("PODIUM_SUBAGENT_TIME_SCALE", default=0.0, parse=non_negative_float)
    """Wall-clock seconds an execution takes per unit of simulated time (0 = instant).
    Pacing makes demos watchable and gives shutdown tests a batch in hand."""
    drift: str = env("PODIUM_SUBAGENT_DRIFT", default="")
    """Drift scenario of the simulated sub-agents: a shipped name (``slow-specialist``,
    ``flaky-agent``, ``none``; ``podium/data/drift/``) or a scenario file; empty = none. Each
    execution samples from the scenario's true pool at (now - origin), while the orchestrator
    keeps planning for the nominal ``PODIUM_POOL_SPEC`` (:mod:`podium.envs.swarm.drift`)."""
    drift_origin: float | None = env("PODIUM_SUBAGENT_DRIFT_ORIGIN", default=None, parse=unix_time)
    """Unix time (seconds) the scenario's ``at_s`` count from; unset = when the service
    started. Several workers given the same origin drift at the same moment."""
