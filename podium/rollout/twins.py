"""Shadow twins: a live session replayed in simulation by another policy, same luck.

A *twin* of a session is the same task run in the simulator under the session's seed. The
orchestrator seeds a session's sub-agents with that seed (:class:`SwarmSimulator`'s execution
seeds hash it with *what* runs, not with the order things start), so every policy that runs
the twin meets the same sub-agent luck on every unit of work (common random numbers): the
paired difference of two policies' returns on one twin is a low-variance comparison of the
policies, not of their luck. A twin of a live session run by the policy that served it
reproduces the session exactly (same decisions, same latency) when it meets the sub-agents the
session met (below); twins never touch sub-agents.

* :func:`twin_case` takes a session's ``Trajectory`` (its task and ``labels["seed"]``);
* :class:`TwinPolicy` is a rule engine (``"rules:cpls"``, :func:`rule_twin`) or a learned
  version (:func:`learned_twin`; :func:`twin_policy` loads one from its signed announcement).
  A learned twin decides greedily (argmax), as live traffic does;
* :class:`TwinEvaluator` runs many twins in lock-step (:func:`podium.policy.rollout.run_episodes`,
  one batched forward pass per step) in the environment configuration the orchestrator gives a
  session of that policy, and returns each twin's environment return (the sum of its step
  rewards: −latency / lower bound, minus the incompletion penalty) or the paired differences.

**Which sub-agents a twin meets.** ``true_pool``: the sub-agents as they really behave
(:mod:`podium.envs.swarm.drift`), while both policies keep reading the nominal pool spec, as
the live ones do — only a caller that knows the truth can give it (tests, benches). A real
controller cannot: with a statistics store (``stats=``, :class:`~podium.observed.AgentStats`)
and no ``true_pool``, outcomes are drawn from the store's *estimated* pool
(:meth:`~podium.observed.AgentStats.estimated_world`: the agents' estimated profiles and the
merges at their observed cost, taken at each :meth:`TwinEvaluator.run`),
so the luck is still the session's (same seed, same draws) but the profiles are the ones
observed: after the sub-agents drift, policies are compared on the world as it is now seen,
not as the pool spec advertises it — the best the controller knows. Every policy reads the
same store, as live sessions do: cpls-online plans on its estimates, a learned version sees
them in its observation's estimate columns. Twins never feed it. The price: a twin on the
estimated pool reproduces its live session only as far as the estimate is the truth (exactly
only on the pool it ran on, with no store). Without either, outcomes come from the nominal
pool (or from the ``true:`` profiles its spec carries).

A learned version twins on any pool (it reads agents by their features); the pool it was
trained on is kept for reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, make_policy
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import PoolSpec
from podium.envs.swarm.trajectory import task_from_proto
from podium.errors import ArtifactError, ConfigError, SpecError
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import load_weights, path_from_uri
from podium.policy.decisions import Episode
from podium.policy.network import SwarmPolicyNet
from podium.policy.rollout import Job, run_episodes
from podium.policy.signing import TrustedKeys, verify_announcement
from podium.policy.swarm import MODEL_NAME, build_swarm_policy, policy_max_subtasks
from podium.policy.versions import is_version_number
from podium.v1 import reward_pb2, trajectory_pb2

RULES_PREFIX = "rules:"
"""How a rule engine is named as a version (``"rules:cpls"``)."""
SEED_LABEL = "seed"
"""The trajectory label holding the session seed the orchestrator seeded its sub-agents with."""
RULE_MIN_SLOTS = 64
"""Slots the orchestrator gives a rule-engine session (``max(64, n)``; rule engines do not read
the observation, so this only keeps the twin's layout the session's)."""
RULE_MAX_DECISIONS = 10_000
"""Decisions after which the orchestrator truncates a rule-engine session (its default
``SessionSettings.max_decisions``); a learned session has the trained limit 50·n + 100."""
DEFAULT_MAX_SUBTASKS = 64
"""Slot count of a learned version whose metadata does not give one (the orchestrator's
``PODIUM_POLICY_MAX_SUBTASKS`` default)."""


@dataclass(frozen=True, slots=True)
class TwinCase:
    """One session to twin: its task and the seed of its sub-agents' luck."""

    session_id: str
    """The live session it twins (for the caller's bookkeeping)."""
    task: TaskSpec
    """The session's task."""
    seed: int
    """The session seed (``Trajectory.labels["seed"]``)."""


def twin_case(trajectory: trajectory_pb2.Trajectory) -> TwinCase | None:
    """The twin of a session's trajectory; None when it cannot be twinned: no seed label, a
    seed that is not a bare decimal below 2^64, or a task that does not validate (the
    trajectory comes off the bus: nothing in it is trusted)."""
    raw = trajectory.labels.get(SEED_LABEL, "")
    if not (0 < len(raw) <= 20 and raw.isascii() and raw.isdigit()) or int(raw) >= 1 << 64:
        return None
    try:
        task = task_from_proto(trajectory.task)
    except SpecError:
        return None
    return TwinCase(trajectory.session_id, task, int(raw))


@dataclass(frozen=True)
class TwinPolicy:
    """A policy that can run twins: a rule engine or a learned version (never both)."""

    version: str
    """``"rules:<name>"`` or a decimal learned version (``"12"``)."""
    rule: str | None = None
    """The rule engine's name (cpls, greedy, sequential), for a rule twin."""
    net: SwarmPolicyNet | None = None
    """The network (eval mode, never mutated), for a learned twin."""
    max_subtasks: int = DEFAULT_MAX_SUBTASKS
    """Slot count S the learned version was trained with (its sessions use max(S, n))."""
    agents: tuple[str, ...] = ()
    """Agent names of the pool the learned version was trained on (reports only; it twins on
    any pool)."""

    def slots(self, n_subtasks: int) -> int:
        """Slots the orchestrator gives a session of ``n_subtasks`` subtasks under this policy."""
        return max(RULE_MIN_SLOTS if self.rule is not None else self.max_subtasks, n_subtasks)

    def env_config(self, slots: int) -> EnvConfig:
        """The environment the orchestrator runs this policy's sessions in, ``slots`` wide,
        seeded with the session seed (see the module docstring)."""
        if self.rule is not None:
            # Rule engines read the state, not the observation: its advice columns are skipped.
            return EnvConfig(
                max_subtasks=slots,
                invalid_action="raise",
                max_steps=RULE_MAX_DECISIONS,
                rule_advice=False,
                session_seeds=True,
            )
        return EnvConfig(max_subtasks=slots, invalid_action="raise", session_seeds=True)


def rule_twin(version: str) -> TwinPolicy:
    """The rule engine named by ``"rules:<name>"``; :class:`ConfigError` for another string or
    an unknown engine (the message lists the known ones)."""
    if not version.startswith(RULES_PREFIX):
        raise ConfigError(f"{version!r} is not a rule engine version (rules:<name>)")
    name = version[len(RULES_PREFIX) :]
    make_policy(name)  # ConfigError naming the known engines
    return TwinPolicy(version=version, rule=name)


def learned_twin(
    version: str,
    net: SwarmPolicyNet,
    max_subtasks: int = DEFAULT_MAX_SUBTASKS,
    *,
    agents: tuple[str, ...] = (),
) -> TwinPolicy:
    """A learned version's twin policy (greedy); ``agents``: the pool it was trained on."""
    if not is_version_number(version):
        raise ConfigError(f"learned version {version!r} is not a decimal version number")
    if max_subtasks < 1:
        raise ConfigError(f"max_subtasks must be >= 1, got {max_subtasks}")
    return TwinPolicy(version=version, net=net, max_subtasks=max_subtasks, agents=agents)


def twin_policy(
    version: str,
    announcement: reward_pb2.PolicyUpdated | None,
    trusted: TrustedKeys | None,
) -> TwinPolicy:
    """The twin policy of a version string.

    ``"rules:<name>"``: that rule engine (no announcement needed). A decimal version: its
    ``announcement`` must be the version's own (model and number), verified exactly as an
    orchestrator verifies it (:func:`podium.policy.signing.verify_announcement`: hashed,
    signed by a key of ``trusted``), and its weights must hash to the announced sha256. Errors:
    :class:`~podium.policy.signing.RefusedAnnouncement` (with its ``reason``) for an
    announcement that must not be served, :class:`ArtifactError` for weights that are missing,
    tampered with or do not build, :class:`ConfigError` for a version string that is neither.
    """
    if version.startswith(RULES_PREFIX):
        return rule_twin(version)
    if not is_version_number(version):
        raise ConfigError(f"version {version!r} is neither rules:<name> nor a decimal version")
    if announcement is None:
        raise ArtifactError(f"learned version {version} needs its signed PolicyUpdated")
    if announcement.model_name != MODEL_NAME or announcement.version != int(version):
        raise ArtifactError(
            f"the announcement is {announcement.model_name!r} v{announcement.version}, not "
            f"{MODEL_NAME!r} v{version}"
        )
    # serving=None: a twin may evaluate any version, older ones included (a rollback target).
    verify_announcement(announcement, trusted, None)
    weights = load_weights(path_from_uri(announcement.uri), announcement.sha256)
    net, agents = build_swarm_policy(weights)
    return learned_twin(
        version, net, policy_max_subtasks(weights, DEFAULT_MAX_SUBTASKS), agents=agents
    )


@dataclass(frozen=True, slots=True)
class TwinOutcome:
    """What one twin did."""

    session_id: str
    """The session it twins."""
    env_return: float
    """Sum of its step rewards (−latency / bound, minus the incompletion penalty)."""
    latency: float
    """Simulated time until it ended."""
    completed: bool
    """Whether every subtask succeeded."""
    lower_bound: float
    """The task's latency lower bound on the nominal pool."""


def _unique_names(tasks: Iterable[TaskSpec]) -> dict[TaskSpec, TaskSpec]:
    """Each distinct task -> itself, or a renamed copy when another distinct task already has
    its name: an environment indexes tasks by name, and live traffic may send two different
    tasks both called ``login-system``. Names never affect a session's dynamics."""
    out: dict[TaskSpec, TaskSpec] = {}
    taken: set[str] = set()
    for task in tasks:
        if task in out:
            continue
        name, k = task.name, 1
        while name in taken:
            name, k = f"{task.name}~{k}", k + 1
        taken.add(name)
        out[task] = task if name == task.name else replace(task, name=name)
    return out


class TwinEvaluator:
    """Runs twins of sessions with any :class:`TwinPolicy` (see the module docstring)."""

    def __init__(
        self,
        pool: PoolSpec,
        *,
        true_pool: PoolSpec | None = None,
        batch: int = 32,
        stats: AgentStats | None = None,
    ) -> None:
        if batch < 1:
            raise ConfigError(f"batch must be >= 1, got {batch}")
        self.stats = stats
        """The statistics store twins read (estimates in the observation, cpls-online) and,
        without ``true_pool``, draw outcomes from (its estimated pool); never fed: a twin is a
        simulation, not a session. None: estimates = advertised."""
        self.pool = SubagentPool(pool)
        """The nominal pool: what the policies read."""
        self.advertised = (
            self.pool if pool.advertised() is pool else SubagentPool(pool.advertised())
        )
        """The nominal pool with any truth and drift stripped (beside an estimated pool)."""
        self.true_pool = None if true_pool is None else SubagentPool(true_pool)
        """The pool outcomes are sampled from, when the caller knows it (see
        :meth:`outcome_pool`)."""
        self.batch = batch
        """Twins in flight at once (one batched forward pass per step for a learned policy)."""
        self._estimated: tuple[tuple[int, int], SubagentPool] | None = None

    def outcome_pool(self) -> SubagentPool | None:
        """What twins draw outcomes from now: ``true_pool`` when given; else the store's
        estimated world at its current version (rebuilt only when the store changed); else
        None (the nominal pool, or the truth its spec carries)."""
        if self.true_pool is not None or self.stats is None:
            return self.true_pool
        key = (id(self.stats), self.stats.version)
        if self._estimated is None or self._estimated[0] != key:
            estimated = SubagentPool(self.stats.estimated_world(self.pool.spec))
            self._estimated = (key, estimated)
        return self._estimated[1]

    def run(self, policy: TwinPolicy, cases: Sequence[TwinCase]) -> list[TwinOutcome]:
        """Every case's twin under ``policy``, in case order."""
        out: list[TwinOutcome | None] = [None] * len(cases)
        for slots, idx in _by_slots(policy, cases).items():
            episodes, _ = self._episodes(policy, slots, [cases[i] for i in idx])
            for i, ep in zip(idx, episodes, strict=True):
                out[i] = TwinOutcome(
                    session_id=cases[i].session_id,
                    env_return=float(ep.rewards.sum(dtype="float64")),
                    latency=float(ep.info["latency"]),
                    completed=bool(ep.info["completed"]),
                    lower_bound=float(ep.info["lower_bound"]),
                )
        return [o for o in out if o is not None]

    def trajectories(
        self, policy: TwinPolicy, cases: Sequence[TwinCase]
    ) -> list[trajectory_pb2.Trajectory]:
        """Every case's twin as the ``Trajectory`` a session of it records (decisions,
        executions, ``labels["seed"]``; ``session_id`` the case's), in case order: what a
        statistics store is fed, for benches and tests. Twins themselves are never published."""
        out: list[trajectory_pb2.Trajectory | None] = [None] * len(cases)
        for slots, idx in _by_slots(policy, cases).items():
            _, trajs = self._episodes(policy, slots, [cases[i] for i in idx], trajectories=True)
            for i, traj in zip(idx, trajs, strict=True):
                traj.session_id = cases[i].session_id
                traj.policy_version = policy.version
                out[i] = traj
        return [t for t in out if t is not None]

    def returns(self, policy: TwinPolicy, cases: Sequence[TwinCase]) -> list[float]:
        """Each case's environment return under ``policy``, in case order."""
        return [o.env_return for o in self.run(policy, cases)]

    def paired(
        self, candidate: TwinPolicy, incumbent: TwinPolicy, cases: Sequence[TwinCase]
    ) -> list[float]:
        """Per case, candidate's return minus incumbent's on the same twin."""
        theirs = self.returns(incumbent, cases)
        return [c - i for c, i in zip(self.returns(candidate, cases), theirs, strict=True)]

    def _episodes(
        self,
        policy: TwinPolicy,
        slots: int,
        cases: Sequence[TwinCase],
        *,
        trajectories: bool = False,
    ) -> tuple[list[Episode], list[trajectory_pb2.Trajectory]]:
        """``cases`` (all ``slots`` wide) run to their ends in lock-step (and their
        trajectories, when asked)."""
        named = _unique_names(c.task for c in cases)
        outcomes = self.outcome_pool()
        # Beside an estimated pool the nominal one must carry no truth of its own (the env
        # refuses the truth given two ways); a caller's true_pool keeps today's contract.
        estimated = outcomes is not None and outcomes is not self.true_pool
        envs = SwarmEnv.replicas(
            min(self.batch, len(cases)),
            list(named.values()),
            self.advertised if estimated else self.pool,
            replace(policy.env_config(slots), feed_stats=False),
            true_pool=outcomes,
            stats=self.stats,
        )
        jobs = [Job(named[c.task], c.seed) for c in cases]
        if policy.rule is not None:
            return run_episodes(envs, jobs, rule=policy.rule, with_trajectories=trajectories)
        assert policy.net is not None
        agent = SwarmAgent(envs[0].layout, net=policy.net)
        return run_episodes(envs, jobs, agent=agent, greedy=True, with_trajectories=trajectories)


def _by_slots(policy: TwinPolicy, cases: Sequence[TwinCase]) -> dict[int, list[int]]:
    """Case indices grouped by the slot count ``policy``'s sessions of them get (one
    lock-step batch of environments per width)."""
    by_slots: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        by_slots.setdefault(policy.slots(len(case.task.subtasks)), []).append(i)
    return by_slots


__all__ = [
    "RULES_PREFIX",
    "TwinCase",
    "TwinEvaluator",
    "TwinOutcome",
    "TwinPolicy",
    "learned_twin",
    "rule_twin",
    "twin_case",
    "twin_policy",
]
