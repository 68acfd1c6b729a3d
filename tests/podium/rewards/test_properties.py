"""Property tests: for any trajectory, the total is the weighted sum of the reported parts."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from podium.rewards import DETECTORS, default_config, load_config, score
from podium.rewards.config import config_from_mapping
from podium.rewards.examples import call
from podium.v1 import reward_pb2, subtask_pb2, task_pb2, trajectory_pb2

CONFIGS = (
    default_config(),
    load_config("podium/data/rewards/parl.yaml"),
    config_from_mapping(
        {"name": "all", "mix": {"parl": 0.5, "multi_objective": 0.3, "multi_stage": 0.2}}
    ),
)
times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
outcomes = st.sampled_from(list(subtask_pb2.Outcome.values()))
tool_calls = st.builds(
    call,
    st.sampled_from(["grep", "noop", "read_file", "run_tests"]),
    st.sampled_from(["{}", '{"a": 1}', '{"a": 1, "b": 2}', '{"b": 2, "a": 1}', "{bad"]),
    malformed=st.booleans(),
)


@st.composite
def trajectories(draw: st.DrawFn) -> trajectory_pb2.Trajectory:
    """A random valid trajectory: a random DAG, random executions of its parts and noise."""
    n = draw(st.integers(0, 6))
    subtasks = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else []
        subtasks.append(
            task_pb2.SubtaskSpec(
                id=f"s{i}",
                kind=draw(st.sampled_from(["design", "code", "ui", "test", "review"])),
                work=draw(st.floats(0.0, 10.0)),
                deps=[f"s{d}" for d in deps],
            )
        )
    ids = [s.id for s in subtasks] or ["ghost"]
    parts = st.sampled_from(ids).flatmap(
        lambda b: st.sampled_from([b, f"{b}#0", f"{b}#1", f"{b}#merge", "stranger"])
    )
    executions = []
    for j in range(draw(st.integers(0, 10))):
        start = draw(times)
        executions.append(
            trajectory_pb2.Execution(
                execution_id=f"e{j}",
                subtask_id=draw(parts),
                agent=draw(st.sampled_from(["generalist", "fast"])),
                start_time=start,
                end_time=start + draw(times),
                outcome=draw(outcomes),
                tool_calls=draw(st.lists(tool_calls, max_size=6)),
                attempt=draw(st.integers(1, 3)),
                verified=draw(st.booleans()),
                stage=draw(st.sampled_from(["", "design", "implement", "verify", "bogus"])),
            )
        )
    return trajectory_pb2.Trajectory(
        trajectory_id="prop",
        task=task_pb2.TaskSpec(
            name="random", max_parallel=draw(st.integers(0, 8)), subtasks=subtasks
        ),
        executions=executions,
        latency=draw(times),
        lower_bound=draw(times),
        completed=draw(st.booleans()),
        claimed_success=draw(st.booleans()),
        test_coverage=draw(st.one_of(st.just(-1.0), st.floats(0.0, 1.0))),
        decisions=[
            trajectory_pb2.Decision(
                step=0,
                observation=trajectory_pb2.ObservationSummary(max_parallel=draw(st.integers(0, 8))),
            )
        ],
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    traj=trajectories(),
    config_index=st.integers(0, len(CONFIGS) - 1),
    progress=st.floats(0.0, 5000.0),
)
def test_total_equals_weighted_sum_of_reported_parts(
    traj: trajectory_pb2.Trajectory, config_index: int, progress: float
) -> None:
    config = CONFIGS[config_index]
    b = score(traj, config, progress)
    assert set(b.components) == set(b.weights) == set(b.raw)
    assert set(b.penalties) == set(DETECTORS)
    for key, value in b.components.items():
        assert 0.0 <= b.raw[key] <= 1.0, key
        assert b.weights[key] >= 0.0, key
        assert math.isclose(value, b.weights[key] * b.raw[key], rel_tol=1e-12, abs_tol=1e-12)
    assert all(p >= 0.0 and math.isfinite(p) for p in b.penalties.values())
    weighted = math.fsum(b.weights[k] * b.raw[k] for k in b.raw)
    assert math.isclose(b.total, weighted - math.fsum(b.penalties.values()), abs_tol=1e-9)
    # The event carries the same numbers, and the JSON view exactly the five public keys.
    msg = b.to_proto(traj)
    assert isinstance(msg, reward_pb2.ScoredTrajectory)
    assert math.isclose(
        msg.total,
        math.fsum(msg.components.values()) - math.fsum(msg.penalties.values()),
        abs_tol=1e-9,
    )
    assert msg.trajectory == traj and len(msg.credit) == len(b.credit)
    assert set(b.to_json_dict()) == {"total", "components", "penalties", "credit", "reward_version"}
    assert score(traj, config, progress) == b  # deterministic
