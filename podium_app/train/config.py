"""Settings and results of ``podium train`` (both drivers share them)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from learner_svc.algorithms.swarm import SwarmPPOConfig, resolve_device
from podium.envs.swarm import EnvConfig
from podium.envs.swarm.baselines import BASELINES
from podium.envs.swarm.planner import PLANNERS
from podium.errors import ConfigError
from podium.policy.network import NetworkConfig
from podium_app.settings_cli import Setting, dump_yaml, flat_values, settings_of

LAYOUT_WIDTHS = ("slot_features", "global_features", "pair_features")
"""The network's input widths: the observation layout's, never a setting."""

DERIVED = {
    "env.max_subtasks": "the run sets it from its task suites (the largest task's subtasks)",
    "env.max_running_obs": "the learner and the orchestrator read the default running table",
    "env.rule_advice": "policies are served with the advice columns on",
    "env.feed_stats": "stats_feed chooses what feeds the statistics stores",
    "ppo.bc_epochs": "bc_epochs (the run's own setting) counts the cloning passes",
    **{
        f"network.{name}": "the observation layout sets the network's input widths"
        for name in LAYOUT_WIDTHS
    },
}
"""Fields of :class:`TrainConfig`'s sections that are not the run's to choose (it computes
them, or what serves the policy fixes them), with the reason: no flag, no config file key (a
file setting one is refused with the reason), not written to ``config.yaml``."""

POSITIVE = (
    "suite_size",
    "test_suite_size",
    "bc_demos_per_task",
    "bc_epochs",
    "episodes_per_iteration",
    "num_envs",
    "eval_every",
    "validation_seeds",
    "test_episodes",
    "torch_threads",
)
"""Counts of :class:`TrainConfig` that must be at least 1."""


_DEFAULT_ENV = EnvConfig(invalid_action="raise")
"""The run's environment settings by default (see :attr:`TrainConfig.env`)."""


def _default_network() -> NetworkConfig:
    """The default network shape; the widths are placeholders (:data:`LAYOUT_WIDTHS`)."""
    return NetworkConfig(slot_features=0, global_features=0, pair_features=0)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything ``podium train`` needs. The defaults take about 22 CPU-minutes, 18.6 minutes of
    wall clock on 2 cores (acting beside the update: :attr:`max_policy_lag`)."""

    run_dir: Path = Path("runs/latest")
    """Where TensorBoard logs, checkpoints, report.html and summary.json go."""
    bus: str = "inproc://"
    """Event bus URL: ``inproc://`` (embedded: reward_svc and learner_svc run as asyncio tasks
    in this process) or ``kafka://HOST:PORT`` (each its own process, started by the driver)."""
    seed: int = 0
    """Seed of the task suite, the sessions and torch."""
    pool: Path | None = None
    """Pool spec file (``--pool``); None = the shipped default pool. Its ``kinds:`` are what
    every planner sees (the advertisement); its ``true:`` profiles, when given, are what the
    simulated sub-agents do (docs/specs.md)."""
    tasks: Path | None = None
    """Task spec directory or file (``--tasks``), checked against the pool; None = the seeded
    generator's suites over the pool's kinds (``suite_size``, ``test_suite_size``)."""
    init: Path | None = None
    """A trained policy to start from (``--init``: a policy ``.safetensors``, its version
    directory or a ``podium train`` run directory) instead of behaviour cloning: one cycle of
    fine-tuning on this run's pool and tasks, e.g. a policy trained elsewhere adapting to a
    user's pool (its stores warmed as usual, :attr:`store_warmup`). None = clone the rule
    engine (the cold start)."""
    pool_variants: int = 0
    """Variants of the pool the actor also runs sessions on (``--pool-variants``; see
    :func:`podium.envs.swarm.pools.pool_variants`): renamed, reshaped pools whose true
    profiles differ from their advertisements (slower, flakier, better). Each training
    session draws its pool uniformly from the base pool and the variants; validation and
    the final table stay on the base pool, the one the policy is for. 0 = the base pool only."""
    agent_stats: bool = True
    """Each pool has a statistics store of its own (:class:`podium.observed.AgentStats`)
    whose estimates the observation reads (and the advice's rule engine plans on, with
    ``EnvConfig.advice="online"``), as orchestrator_svc's store does in production; off,
    every estimate is the advertisement."""
    store_warmup: int = 1
    """cpls sessions (on the advertisement) per training task that feed each pool's store
    before anything else, as ``podium bench scheduling --warmup`` warms the stores it
    measures with: the policy starts on stores like the ones it will be judged on. 0 = none."""
    stats_feed: Literal["sessions", "warmup"] = "sessions"
    """What feeds the stores after the warm-up: ``"sessions"``, every training session
    (cloning demonstrations, sampled sessions, rollout baselines, validation) at its end, as
    a deployment's sessions feed its store; ``"warmup"``, nothing: training reads the
    warm-up's store, which has seen only what cpls does (the bench's starting point), so
    agents the rule engine never tries keep their advertisement there too."""
    test_fraction: float = 0.2
    """Share of a ``--tasks`` library held out for the final table (chosen by a hash of the
    task names, never trained on)."""
    min_tasks_to_hold_out: int = 10
    """A ``--tasks`` library with fewer tasks holds nothing out: training, validation and the
    final table all use every task (the report says the table then measures fit)."""
    suite_size: int = 400
    """Tasks generated for training + validation (shapes: chain, fan-out, diamond, layered)."""
    sizes: tuple[int, int] = (5, 60)
    """Subtask counts of generated training tasks (the shipped generator's range)."""
    extra_kind_p: float = 0.05
    """Per-subtask probability that a generated *training* task uses a kind no specialist
    covers (:data:`~podium.envs.swarm.generator.GENERALIST_ONLY_KINDS`, the observation's
    "other" kind). Without them the policy first meets that token on a task like the shipped
    login-system and mis-schedules it (measured: 3.68 latency/bound vs cpls 2.05 there). The
    held-out test suite stays the shipped generator's default distribution."""
    test_suite_size: int = 60
    """Held-out test tasks generated with another seed, sizes ``test_sizes``."""
    test_sizes: tuple[int, int] = (5, 60)
    """Subtask counts of the held-out test tasks (the shipped generator's range)."""
    validation_fraction: float = 0.15
    """Share of the training suite used to choose the best version (never trained on)."""
    curriculum: tuple[int, ...] = (20, 40, 60)
    """Largest task size of each curriculum stage; stages split the iterations evenly."""
    bc_demos_per_task: int = 1
    """cpls sessions per training task for behaviour cloning."""
    bc_epochs: int = 2
    """Behaviour-cloning passes over the demonstrations (with the rule-advice features two
    passes reproduce cpls's decisions on held-out tasks exactly)."""
    teacher: str = "advice"
    """Whose decisions behaviour cloning and DAgger imitate: ``"advice"`` (the rule engine
    the observation's advice columns carry, :func:`teacher_rule`: the clone then starts as
    that rule engine), or a rule engine's or a planner's name, e.g. ``"planner-online"``
    (Monte-Carlo policy improvement over cpls-online on the statistics store's estimates,
    :mod:`podium.envs.swarm.planner`: about a second a session, so its demonstrations cost
    minutes; the clone learns where departing from its advice pays)."""
    dagger_rounds: int = 0
    """DAgger rounds after cloning: the policy drives on every training task, the teacher
    labels the states it reaches."""
    dagger_epochs: int = 2
    """Behaviour-cloning passes over all data after each DAgger round."""
    iterations: int = 60
    """PPO iterations (one policy version each)."""
    episodes_per_iteration: int = 96
    """Sessions per PPO iteration."""
    num_envs: int = 32
    """Sessions simulated in lock-step (one batched forward pass per step)."""
    eval_every: int = 10
    """Iterations between validation runs."""
    validation_seeds: int = 3
    """Sessions per validation task."""
    test_episodes: int = 6
    """Sessions per held-out test task in the final table."""
    critic_warmup_iterations: int = 1
    """First PPO iterations that fit only the value head (see ``ppo_update(critic_only=)``):
    the cloned critic never saw the reward service's score nor the rollout baseline."""
    rollout_baseline: str | None = "advice"
    """Rule engine run on the same (task, seed) as every PPO session, its environment return
    (−latency/bound, minus the incompletion penalty if it could not finish) subtracted from
    the session's return: the greedy-rollout baseline of Kool et al. (2019). Sub-agent luck
    is keyed by the unit of work (common random numbers, see
    :mod:`podium.envs.swarm.simulator.executor`), so the return becomes "how much better than
    the rule engine under the same luck" and a departure from the rule engine is judged
    against what the rule engine did, not against the noise of other sessions. The baseline
    does not depend on the policy's actions, so the policy gradient stays unbiased.
    ``"advice"`` (the default): the rule engine whose decisions the observation's advice
    columns carry (:func:`teacher_rule`: ``cpls``, or ``cpls-online`` with
    ``EnvConfig.advice="online"``), i.e. the policy PPO starts from; a rule engine's name;
    None: the critic alone."""
    reward_timeout_s: float = 300.0
    """How long the driver waits for a batch to be scored, or a version to be announced,
    before failing."""
    ppo: SwarmPPOConfig = field(
        default_factory=lambda: SwarmPPOConfig(
            gae_lambda=1.0,
            learning_rate=1e-4,
            learning_rate_end=1e-5,
            ent_coef_start=0.003,
            ent_coef_end=0.0003,
        )
    )
    """PPO and behaviour-cloning hyperparameters. λ = 1: with the rollout baseline the
    Monte-Carlo return is low-variance, and only it carries the paired comparison back to the
    early decisions (λ < 1 would hand them to a critic that cannot see the session's luck).
    Small steps and little entropy: PPO fine-tunes a policy that already *is* the rule engine
    (measured on the held-out suite: lr 1e-4 and entropy 0.003 beat cpls by 0.012
    latency/bound, lr 3e-4 and entropy 0.01 by 0.003, drifting off it in between)."""
    env: EnvConfig = field(default_factory=lambda: _DEFAULT_ENV)
    """The simulated environment of every session (training, validation, the final table).
    ``max_subtasks`` is the run's (its largest task); an invalid action raises by default, as
    a policy acting through its mask never takes one and a bug must not pass as a penalty."""
    network: NetworkConfig = field(default_factory=_default_network)
    """Shape of the policy network behaviour cloning builds (``d_model``, ``heads``,
    ``layers``, ``ff_mult``; the input widths are the observation's). With ``init`` the
    network is the given policy's, so these must stay at their defaults."""
    device: str = "cpu"
    """Where behaviour cloning and the learner's PPO updates run: ``cpu``, ``cuda``,
    ``cuda:N`` or ``auto`` (cuda when one is available, else cpu). The actor's sessions run
    their batched forward passes on the CPU either way (small tensors, one step at a time)."""
    torch_threads: int = 1
    """Intra-op threads of torch in this process and in the learner: 1 keeps the arithmetic
    the same on every machine and leaves the other cores to the services; more speeds up
    the updates of a large network or batch on a machine to itself."""
    max_policy_lag: int = 1
    """The learner's η, and whether the actor samples ahead. With 1 (the default) the actor
    runs the next iteration's sessions with the version it serves while the learner updates
    on this iteration's, so acting and the update share the machine's cores instead of
    taking turns; those sessions are one version behind (PPO's probability ratio is taken
    against the version that acted, so the update stays correct). Iterations that validate
    wait for their version first (validation judges the newest). 0: the driver waits for
    each version before the next batch, every trajectory on-policy, a slower run."""
    python: str = sys.executable
    """Interpreter that runs the service processes (``kafka://`` only)."""
    stop_timeout_s: float = 30.0
    """How long a service process may take to stop after SIGTERM (``kafka://`` only)."""
    model_repository: Path | None = None
    """Triton model repository to export every published version >= 1 into as ONNX
    (``<repo>/swarm_policy/<version>/model.onnx``, announced as ``onnx_uri`` /
    ``onnx_sha256``); None = weights only."""

    def __post_init__(self) -> None:
        """ConfigError naming the setting for values the run could not honour."""
        if self.store_warmup < 0:
            raise ConfigError(f"store_warmup must be >= 0, got {self.store_warmup}")
        if self.stats_feed not in ("sessions", "warmup"):
            raise ConfigError(f"stats_feed must be 'sessions' or 'warmup', got {self.stats_feed!r}")
        if self.iterations < 0:  # 0 is a behaviour clone alone (the bootstraps make one)
            raise ConfigError(f"iterations must be >= 0, got {self.iterations}")
        if self.teacher != ADVICE and self.teacher not in {*BASELINES, *PLANNERS}:
            known = ", ".join(sorted({ADVICE, *BASELINES, *PLANNERS}))
            raise ConfigError(f"teacher must be one of {known}, got {self.teacher!r}")
        if self.pool_variants < 0:
            raise ConfigError(f"pool_variants must be >= 0, got {self.pool_variants}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}")
        for name in POSITIVE:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        self._check_sections()
        if self.min_tasks_to_hold_out < 3:
            raise ConfigError(
                "min_tasks_to_hold_out must be >= 3 (a training, a validation and a test "
                f"task), got {self.min_tasks_to_hold_out}"
            )

    def _check_sections(self) -> None:
        """ConfigError naming the section's setting the run could not honour."""
        net = self.network
        if min(net.d_model, net.heads, net.layers, net.ff_mult) < 1:
            raise ConfigError("network.d_model, heads, layers and ff_mult must be >= 1")
        if net.d_model % net.heads:
            raise ConfigError(
                f"network.d_model ({net.d_model}) must be divisible by network.heads ({net.heads})"
            )
        if self.init is not None and net != _default_network():
            raise ConfigError(
                "network: with init the network is the given policy's; leave network.* unset"
            )
        for key, why in DERIVED.items():
            section, _, name = key.partition(".")
            if section == "env" and getattr(self.env, name) != getattr(_DEFAULT_ENV, name):
                raise ConfigError(f"{key} cannot be set: {why}")
        resolve_device(self.device)  # a device this machine lacks fails here, naming it

    def network_shape(self) -> dict[str, int]:
        """The network's settings, without the layout's input widths (``SwarmAgent``'s
        ``net_kwargs``)."""
        return {k: v for k, v in self.network.to_dict().items() if k not in LAYOUT_WIDTHS}

    def to_json(self) -> dict[str, Any]:
        """Plain values for the run's config.json."""
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["pool"] = str(self.pool) if self.pool else None
        d["tasks"] = str(self.tasks) if self.tasks else None
        d["init"] = str(self.init) if self.init else None
        d["model_repository"] = str(self.model_repository) if self.model_repository else None
        return d


@dataclass(slots=True)
class IterationLog:
    """One row of the learning curve."""

    iteration: int
    version: int
    stage_max_size: int
    train_ratio: float
    train_completion: float
    reward_total: float
    stats: dict[str, float]
    val_ratio: float | None = None
    val_completion: float | None = None
    wall_s: float = 0.0


@dataclass(slots=True)
class TrainResult:
    """What :func:`podium_app.train.job.train` produced."""

    run_dir: Path
    """The run directory."""
    best_version: int
    """The version validation chose (the one in the held-out table)."""
    best_checkpoint: Path
    """Its weights, copied to ``<run_dir>/policy.safetensors``."""
    history: list[IterationLog]
    """The learning curve, one row per version."""
    bc_history: list[dict[str, float]]
    """Behaviour cloning, one row per pass."""
    cpls_val_ratio: float
    """cpls's latency/bound on the validation sessions."""
    summary: dict[str, Any]
    """The held-out table (``podium bench scheduling`` JSON shape)."""
    wall_s: float
    """Wall time of the run."""
    exit_codes: dict[str, int] = field(default_factory=dict)
    """How each learning service ended (0: stopped cleanly)."""


Progress = Callable[[str, dict[str, float]], None]
"""Callback for the live display: (phase, figures)."""

ADVICE = "advice"
"""``TrainConfig.rollout_baseline`` value naming the advice's rule engine (:func:`teacher_rule`)."""


def train_settings() -> list[Setting]:
    """Every setting of :class:`TrainConfig` a flag or config file may set (its sections'
    fields included, :data:`DERIVED` left out), defaults the ones in force."""
    return settings_of(TrainConfig(), derived=DERIVED)


def config_yaml(config: TrainConfig) -> str:
    """``config`` as the YAML config file that reproduces it (``--config FILE``)."""
    return dump_yaml(config, train_settings())


def hyperparameters(config: TrainConfig) -> dict[str, bool | int | float | str]:
    """Every setting of ``config`` as TensorBoard's hparams take them (dotted keys; None as
    ``"none"``, paths and lists as text)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in flat_values(config, train_settings()).items():
        out[key] = value if isinstance(value, bool | int | float | str) else str(value)
        if value is None:
            out[key] = "none"
    return out


def cloning_teacher(config: TrainConfig) -> str:
    """The policy behaviour cloning imitates: :attr:`TrainConfig.teacher`, with ``"advice"``
    resolved by :func:`teacher_rule`."""
    if config.teacher == ADVICE:
        return teacher_rule(config.env.advice)
    return config.teacher


def teacher_rule(advice: str) -> str:
    """The rule engine whose decisions the observation's advice columns carry for
    ``EnvConfig.advice`` ``advice``: ``cpls`` on the advertisement, or ``cpls-online`` on the
    statistics store's estimates. Behaviour cloning imitates it (the labels must be the
    decisions the advice shows, or cloning learns to ignore the advice where they differ) and
    the rollout baseline replays it by default."""
    return "cpls-online" if advice == "online" else "cpls"


__all__ = [
    "ADVICE",
    "DERIVED",
    "IterationLog",
    "Progress",
    "TrainConfig",
    "TrainResult",
    "cloning_teacher",
    "config_yaml",
    "hyperparameters",
    "teacher_rule",
    "train_settings",
]
