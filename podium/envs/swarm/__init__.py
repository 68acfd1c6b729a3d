"""The Agent Swarm environment: task and pool specs, the lower bound, the frozen sub-agent
pool, the scheduling state machine, its event-driven simulator and Gymnasium env, rule-engine
baselines, a seeded task generator and trajectory export. See ``docs/specs.md``."""

from podium.envs.swarm.baselines import (
    BASELINES,
    Command,
    CplsPolicy,
    GreedyPolicy,
    RandomPolicy,
    SchedulingPolicy,
    SequentialPolicy,
    make_policy,
)
from podium.envs.swarm.bound import LowerBound, lower_bound, upward_ranks
from podium.envs.swarm.pool import ExecutionSample, SubagentPool, sample_execution
from podium.envs.swarm.simulator import ActionCodec, EnvConfig, SwarmEnv, SwarmSimulator
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
    "ActionCodec",
    "AgentSpec",
    "Command",
    "CplsPolicy",
    "EnvConfig",
    "ExecutionSample",
    "GreedyPolicy",
    "InvalidActionError",
    "KindProfile",
    "LowerBound",
    "PoolSpec",
    "RandomPolicy",
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
]
