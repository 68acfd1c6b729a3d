"""The Agent Swarm environment: task and pool specs, the lower bound, the frozen sub-agent
pool, the scheduling state machine and its event-driven simulator, the Gymnasium env with its
action codec and named observation layout, the scheduling-policy interface with rule-engine
baselines, a seeded task generator and trajectory export. See ``docs/specs.md``.

Modules: ``spec``, ``bound``, ``pool``, ``state``, ``simulator`` (the dynamics); ``actions``
(action codec and mask), ``observation`` (layout and encoder), ``env`` (Gymnasium API);
``scheduling`` (the policy interface), ``baselines``, ``benchmark``; ``trajectory``
(the one Trajectory builder); ``generator``.
"""

from podium.envs.swarm.actions import FINISH, START, WAIT, ActionCodec, valid_action_mask
from podium.envs.swarm.baselines import (
    BASELINES,
    Command,
    CplsOnlinePolicy,
    CplsPolicy,
    GreedyPolicy,
    RandomPolicy,
    RuleEngine,
    SequentialPolicy,
    make_policy,
)
from podium.envs.swarm.bound import LowerBound, lower_bound, upward_ranks
from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.observation import ObservationLayout
from podium.envs.swarm.pool import ExecutionSample, SubagentPool, sample_execution
from podium.envs.swarm.scheduling import PolicyStep, Rng, SchedulingPolicy
from podium.envs.swarm.simulator import SwarmSimulator
from podium.envs.swarm.spec import (
    AgentSpec,
    KindProfile,
    PoolSpec,
    Subtask,
    TaskSpec,
    default_pool,
    default_tasks,
    load_pool,
    load_task,
    load_tasks,
    parse_pool,
    parse_task,
)
from podium.envs.swarm.state import InvalidActionError, StateConfig, SwarmState

__all__ = [
    "BASELINES",
    "FINISH",
    "START",
    "WAIT",
    "ActionCodec",
    "AgentSpec",
    "Command",
    "CplsOnlinePolicy",
    "CplsPolicy",
    "EnvConfig",
    "ExecutionSample",
    "GreedyPolicy",
    "InvalidActionError",
    "KindProfile",
    "LowerBound",
    "ObservationLayout",
    "PolicyStep",
    "PoolSpec",
    "RandomPolicy",
    "Rng",
    "RuleEngine",
    "SchedulingPolicy",
    "SequentialPolicy",
    "StateConfig",
    "SubagentPool",
    "Subtask",
    "SwarmEnv",
    "SwarmSimulator",
    "SwarmState",
    "TaskSpec",
    "default_pool",
    "default_tasks",
    "load_pool",
    "load_task",
    "load_tasks",
    "lower_bound",
    "make_policy",
    "parse_pool",
    "parse_task",
    "sample_execution",
    "upward_ranks",
    "valid_action_mask",
]
