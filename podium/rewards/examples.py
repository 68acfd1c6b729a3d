"""Example trajectories: a clean session and one committing each hack, on one small task.

The files in ``podium/data/trajectories/`` are these messages in the protobuf JSON mapping
(``python -m podium.rewards.examples`` rewrites them); tests check the two never drift apart.

The task: design ``d`` → implement ``a`` and splittable ``b`` → test ``t``, with
max_parallel 3. Its lower bound is the longest chain at best durations, with ``b`` split in two
chunks plus a merge: d + (b/2 + merge) + t = 2 + (3 + 1) + 2 = 8.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from podium.codec import message_to_json
from podium.v1 import subtask_pb2, task_pb2, trajectory_pb2

S, F, M = subtask_pb2.OUTCOME_SUCCESS, subtask_pb2.OUTCOME_FAILURE, subtask_pb2.OUTCOME_MALFORMED


def example_task() -> task_pb2.TaskSpec:
    """The four-subtask task every example runs."""
    return task_pb2.TaskSpec(
        name="feature-with-tests",
        max_parallel=3,
        subtasks=[
            task_pb2.SubtaskSpec(id="d", kind="design", work=2.0),
            task_pb2.SubtaskSpec(id="a", kind="backend", work=4.0, deps=["d"]),
            task_pb2.SubtaskSpec(id="b", kind="ui", work=6.0, deps=["d"], splittable=True),
            task_pb2.SubtaskSpec(id="t", kind="test", work=2.0, deps=["a", "b"]),
        ],
    )


def call(name: str, args: str = "{}", *, malformed: bool = False) -> subtask_pb2.ToolCall:
    """A tool call (ok unless malformed)."""
    return subtask_pb2.ToolCall(
        name=name, arguments_json=args, ok=not malformed, malformed=malformed, result_digest=""
    )


def execution(
    eid: str,
    subtask_id: str,
    start: float,
    end: float,
    outcome: int = S,
    *,
    agent: str = "generalist",
    verified: bool = True,
    calls: Sequence[subtask_pb2.ToolCall] = (),
    split_k: int = 1,
    attempt: int = 1,
) -> trajectory_pb2.Execution:
    """One execution with a stage tag derived from its subtask."""
    stage = {"d": "design", "t": "verify"}.get(subtask_id.split("#")[0], "implement")
    return trajectory_pb2.Execution(
        execution_id=eid,
        subtask_id=subtask_id,
        agent=agent,
        kind=stage,
        start_time=start,
        end_time=end,
        outcome=outcome,  # type: ignore[arg-type]
        tool_calls=list(calls),
        attempt=attempt,
        split_k=split_k,
        verified=verified and outcome == S,
        stage=stage,
    )


def _trajectory(
    name: str,
    executions: Sequence[trajectory_pb2.Execution],
    *,
    latency: float,
    completed: bool = True,
    claimed: bool | None = None,
    coverage: float = 0.85,
) -> trajectory_pb2.Trajectory:
    return trajectory_pb2.Trajectory(
        trajectory_id=f"example-{name}",
        session_id=f"example-{name}",
        env="swarm",
        task=example_task(),
        executions=list(executions),
        latency=latency,
        lower_bound=8.0,
        completed=completed,
        claimed_success=completed if claimed is None else claimed,
        test_coverage=coverage,
        verifier_present=True,
        policy_version="example:0",
        labels={"example": name},
    )


def _work_calls(tag: str) -> list[subtask_pb2.ToolCall]:
    return [
        call("read_file", f'{{"path": "{tag}.py"}}'),
        call("write_file", f'{{"path": "{tag}.py"}}'),
    ]


def _clean_executions(
    *, b_chunks: tuple[tuple[float, float], tuple[float, float]] = ((2.0, 5.0), (2.0, 5.0))
) -> list[trajectory_pb2.Execution]:
    (s0, e0), (s1, e1) = b_chunks
    merge_start = max(e0, e1)
    t_start = merge_start + 1.0
    return [
        execution("x-d", "d", 0.0, 2.0, calls=_work_calls("design")),
        execution("x-a", "a", 2.0, 6.0, calls=_work_calls("api")),
        execution("x-b0", "b#0", s0, e0, calls=_work_calls("ui0"), split_k=2),
        execution("x-b1", "b#1", s1, e1, calls=_work_calls("ui1"), split_k=2),
        execution("x-bm", "b#merge", merge_start, merge_start + 1.0, calls=_work_calls("ui")),
        execution(
            "x-t", "t", t_start, t_start + 2.0, calls=[call("run_tests", '{"suite": "all"}')]
        ),
    ]


def clean() -> trajectory_pb2.Trajectory:
    """Everything done in parallel where the DAG allows, verified, good coverage."""
    return _trajectory("clean", _clean_executions(), latency=8.5)


def fake_parallelism() -> trajectory_pb2.Trajectory:
    """``b`` split in two chunks that run one after the other (spawned, executed serially)."""
    return _trajectory(
        "fake_parallelism", _clean_executions(b_chunks=((2.0, 5.0), (5.0, 8.0))), latency=11.5
    )


def tool_abuse() -> trajectory_pb2.Trajectory:
    """``a`` repeats the same search six times and pads with no-ops."""
    ex = _clean_executions()
    busy = [call("grep", '{"pattern": "TODO"}')] * 6 + [call("noop")] * 4
    ex[1].tool_calls.extend(busy)
    return _trajectory("tool_abuse", ex, latency=8.5)


def fabricated_result() -> trajectory_pb2.Trajectory:
    """The tests fail, yet the session reports success."""
    ex = _clean_executions()
    ex[-1].outcome = F
    ex[-1].verified = False
    return _trajectory("fabricated_result", ex, latency=8.5, completed=False, claimed=True)


def trivial_tests() -> trajectory_pb2.Trajectory:
    """All green, but the tests cover 10% of the code."""
    return _trajectory("trivial_tests", _clean_executions(), latency=8.5, coverage=0.1)


def broken_tool_calls() -> trajectory_pb2.Trajectory:
    """``a`` makes two unparseable calls and its first attempt returns malformed output."""
    ex = _clean_executions()
    ex[1].tool_calls.extend(
        [call("write_file", '{"path": ', malformed=True), call("wirte_file", "{}", malformed=True)]
    )
    first = execution("x-a0", "a", 2.0, 3.0, M, calls=[call("read_file", '{"path": "api.py"}')])
    ex[1].attempt = 2
    ex.insert(1, first)
    return _trajectory("broken_tool_calls", ex, latency=8.5)


def avoidance() -> trajectory_pb2.Trajectory:
    """Finishes right after implementing, never attempting the test subtask."""
    ex = _clean_executions()[:-1]
    return _trajectory("avoidance", ex, latency=6.5, completed=False, claimed=False, coverage=-1.0)


def failed_on_critical_path() -> trajectory_pb2.Trajectory:
    """Honest failure: the merge of ``b`` (critical path) fails twice; ``t`` is blocked."""
    ex = _clean_executions()[:-1]
    ex[-1].outcome = F
    ex[-1].verified = False
    ex.append(execution("x-bm2", "b#merge", 6.0, 7.0, F, attempt=2, calls=_work_calls("ui")))
    return _trajectory("failed_on_critical_path", ex, latency=7.5, completed=False, coverage=-1.0)


EXAMPLES: dict[str, Callable[[], trajectory_pb2.Trajectory]] = {
    "clean": clean,
    "fake_parallelism": fake_parallelism,
    "tool_abuse": tool_abuse,
    "fabricated_result": fabricated_result,
    "trivial_tests": trivial_tests,
    "broken_tool_calls": broken_tool_calls,
    "avoidance": avoidance,
    "failed_on_critical_path": failed_on_critical_path,
}
"""Example name → builder; the file is ``podium/data/trajectories/<name>.json``."""


def write_examples(directory: Path) -> list[Path]:
    """Write every example as protobuf JSON into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in EXAMPLES.items():
        path = directory / f"{name}.json"
        path.write_text(message_to_json(build()) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    target = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "data/trajectories"
    )
    for p in write_examples(target):
        print(p)
