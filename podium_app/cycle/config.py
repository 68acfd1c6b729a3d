"""Settings of one drift / continuous-improvement run (``podium bench cycle``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from podium.envs.swarm.spec import PoolSpec, default_pool, load_pool

RUNS = ("frozen", "continuous")
"""The two deployments a cycle bench compares, in the order they run (the frozen one first);
each publishes the initial policy and makes it live (podium_app.bootstrap's shared steps)."""
DRIFT_TARGETS = ("named", "preferred")
"""Values of ``--drift-target`` (:attr:`CycleConfig.drift_target`)."""


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """Everything ``podium bench cycle`` needs; the CLI flags map 1:1 onto these fields."""

    work_dir: Path = Path("runs/cycle")
    """Broker data, service logs, the initial policy, the learner's checkpoints."""
    bus: str = ""
    """``kafka://`` URL of a broker to use (its standard topics must be this bench's alone);
    empty = a local secured KRaft broker of the run's own under ``work_dir/kafka``."""
    checkpoint: Path | None = None
    """Initial policy (``policy.safetensors`` of a ``podium train`` run); None = a quick
    behaviour-cloned one trained by ``podium train`` code with no PPO iteration."""
    pool: Path | None = None
    """Pool spec of the sub-agents (``podium/data/pools`` format; every service gets it as
    ``PODIUM_POOL_SPEC``): planners read its advertised profiles, the sub-agents and the
    replayed references draw from its ``true:`` ones when it has them. None = the shipped
    default pool."""
    duration_s: float = 600.0
    """Seconds of load per run (sessions are submitted over this span)."""
    drift_at_s: float = 200.0
    """Seconds into the load at which the drift scenario's first change takes effect."""
    drift: str = "slow-specialist"
    """Drift scenario of the sub-agents (a shipped name or a file, ``podium/data/drift``)."""
    drift_target: str = "named"
    """Which agents the drift hits: ``named``, the scenario's own; ``preferred``, for each
    (agent, kind) it names, the agent the initial policy had run that kind on most when the
    drift bites (a simulator replay of the load's sessions before it,
    :func:`~podium_app.cycle.measure.preferred_drift`), so the drift bites whatever the task
    mix led the stores to prefer."""
    rate: float = 2.0
    """Sessions submitted per second, steadily."""
    window_s: float = 50.0
    """Width of the measurement windows (by submission time)."""
    replicas: int = 2
    """Orchestrator replicas (each a process)."""
    seed: int = 0
    """Seed of the task mix and of every session's sub-agent luck (paired across runs)."""
    tasks: int = 12
    """Distinct tasks of the load (generated, 5-10 subtasks over every kind)."""
    time_scale: float = 0.002
    """Sub-agents' wall seconds per simulated time unit."""
    cycle_s: float = 30.0
    """The rollout controller's cycle (``PODIUM_ROLLOUT_CYCLE_S``): compressed time."""
    learner_batch: int = 24
    """Sampled sessions per learner update (``PODIUM_LEARNER_BATCH``)."""
    explore_share: float = 0.25
    """Share of sessions the orchestrator samples (the learner's on-policy data: it trains
    only on sampled sessions); the rest are decided greedily, as users get them, and only
    those are measured. The same sessions in every run."""
    retrain_after_s: float = 0.0
    """Seconds after the drift bites at which the continuous run's retraining job starts; 0:
    none, the continuous run's candidates are learner_svc's PPO versions. With it the
    continuous run has no PPO learner: once, that long after the drift, the bench builds the
    world its own statistics store of the run's trajectories saw (agents and merges as
    observed, :func:`~podium.observed.store.observed_pool`; never the truth), clones
    ``planner-online`` there with ``podium train`` and publishes the clone as the next version
    with the learner's code and key; the controller proposes it at its next cycle."""
    runs: tuple[str, ...] = RUNS
    """Which of :data:`RUNS` to run (both for the acceptance verdicts)."""
    drain_s: float = 90.0
    """Longest wait after the load for every session to finish."""
    stop_timeout_s: float = 15.0
    """SIGTERM -> SIGKILL grace of every process."""
    python: str = ""
    """Interpreter of the service processes; empty = this one."""

    def pool_spec(self) -> PoolSpec:
        """The pool the run's sub-agents are (:attr:`pool`, else the shipped default); raises
        :class:`~podium.errors.SpecError` naming a bad file's problem."""
        return load_pool(self.pool) if self.pool is not None else default_pool()

    @property
    def windows(self) -> int:
        """Number of measurement windows over the load."""
        return max(1, int(-(-self.duration_s // self.window_s)))

    @property
    def sessions(self) -> int:
        """Sessions submitted per run."""
        return max(1, round(self.duration_s * self.rate))


def validate(config: CycleConfig) -> None:
    """Raise ``ValueError('--flag: why')`` for the first bad setting (the CLI exits 2 with it)."""
    checks: list[tuple[bool, str]] = [
        (config.duration_s > 0, "--duration-s: must be > 0"),
        (
            0 < config.drift_at_s < config.duration_s,
            f"--drift-at-s: must be inside the load (0, {config.duration_s:g})",
        ),
        (
            config.drift_target in DRIFT_TARGETS,
            f"--drift-target: must be one of {', '.join(DRIFT_TARGETS)}, "
            f"got {config.drift_target!r}",
        ),
        (config.rate > 0, "--rate: must be > 0 sessions per second"),
        (
            0 < config.window_s <= config.duration_s,
            f"--window-s: must be in (0, {config.duration_s:g}]",
        ),
        (config.replicas >= 1, "--replicas: must be >= 1"),
        (config.tasks >= 1, "--tasks: must be >= 1"),
        (config.time_scale >= 0, "--time-scale: must be >= 0"),
        (config.cycle_s > 0, "--cycle-s: must be > 0"),
        (config.learner_batch >= 1, "--learner-batch: must be >= 1"),
        (0 <= config.explore_share < 1, "--explore-share: must be in [0, 1)"),
        (config.drain_s > 0, "--drain-s: must be > 0"),
        (
            config.retrain_after_s == 0
            or 0 < config.retrain_after_s < config.duration_s - config.drift_at_s,
            "--retrain-after-s: must be 0 (none) or inside the load after the drift "
            f"(0, {config.duration_s - config.drift_at_s:g})",
        ),
        (
            bool(config.runs) and all(r in RUNS for r in config.runs),
            f"--runs: each must be one of {', '.join(RUNS)}",
        ),
        (
            not config.bus or config.bus.startswith("kafka://"),
            f"--bus: must be a kafka:// URL, got {config.bus!r}",
        ),
        (
            config.checkpoint is None or config.checkpoint.is_file(),
            f"--checkpoint: {config.checkpoint} is not a file",
        ),
        (config.pool is None or config.pool.is_file(), f"--pool: {config.pool} is not a file"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


__all__ = ["DRIFT_TARGETS", "RUNS", "CycleConfig", "validate"]
