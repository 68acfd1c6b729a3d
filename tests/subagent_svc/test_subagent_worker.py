"""The sub-agent worker: deterministic executions from the seed, visible errors, context only."""

from __future__ import annotations

from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import default_pool
from podium.v1 import subtask_pb2, task_pb2
from subagent_svc.app import execute, result_event_id


def assigned(
    agent: str = "qa", kind: str = "test", seed: int = 42, deps: tuple[tuple[str, str], ...] = ()
) -> subtask_pb2.SubtaskAssigned:
    return subtask_pb2.SubtaskAssigned(
        session_id="s",
        execution_id="s.r.0",
        subtask_id="t",
        kind=kind,
        agent=agent,
        attempt=1,
        split_k=1,
        context=subtask_pb2.ExecutionContext(
            subtask=task_pb2.SubtaskSpec(id="t", kind=kind, work=2.0),
            dependency_results=[
                subtask_pb2.DependencyResult(subtask_id=d, output=o) for d, o in deps
            ],
        ),
        sim_time=1.5,
        seed=seed,
    )


def test_execution_is_the_pools_sample_for_the_seed() -> None:
    pool = SubagentPool(default_pool())
    for seed in range(20):
        result = execute(pool, assigned(seed=seed))
        sample = pool.sample("qa", "test", 2.0, seed)
        assert result.start_time == 1.5
        assert result.end_time == 1.5 + sample.duration
        assert (result.outcome == subtask_pb2.OUTCOME_SUCCESS) == sample.success
        assert result == execute(pool, assigned(seed=seed))  # deterministic, replayable


def test_output_reflects_exactly_the_context_given() -> None:
    pool = SubagentPool(default_pool())
    seed = next(s for s in range(100) if pool.sample("qa", "test", 2.0, s).success)
    a = execute(pool, assigned(seed=seed, deps=(("api", "v1"),)))
    b = execute(pool, assigned(seed=seed, deps=(("api", "v2"),)))
    assert a.outcome == b.outcome == subtask_pb2.OUTCOME_SUCCESS
    assert a.output != b.output  # a dependency's output changed, so does the dependent's
    assert a.output.startswith("test:t:") and len(a.output) < 40  # a short result, no trace


def test_impossible_assignments_come_back_malformed_and_named() -> None:
    pool = SubagentPool(default_pool())
    unknown = execute(pool, assigned(agent="wizard"))
    assert unknown.outcome == subtask_pb2.OUTCOME_MALFORMED
    assert "unknown agent 'wizard'" in unknown.error
    wrong_kind = execute(pool, assigned(agent="qa", kind="db"))
    assert wrong_kind.outcome == subtask_pb2.OUTCOME_MALFORMED
    assert "cannot do kind 'db'" in wrong_kind.error
    assert wrong_kind.end_time == wrong_kind.start_time


def test_result_event_id_is_stable_per_execution() -> None:
    assert result_event_id("x.1") == result_event_id("x.1") != result_event_id("x.2")
