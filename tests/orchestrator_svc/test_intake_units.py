"""The pure parts of crash-safe sessions: the commit watermark of a tasks partition, trajectory
trimming to the broker's limit, and session ids derived from ``client_request_id``."""

from __future__ import annotations

from orchestrator_svc.app import session_id_for
from orchestrator_svc.fit import TRIMMED_LABEL, TRUNCATED_LABEL, fit_trajectory
from orchestrator_svc.intake import PartitionTrack
from podium.bus.base import Record
from podium.v1 import subtask_pb2, task_pb2, trajectory_pb2


def _record(offset: int) -> Record:
    return Record("podium.tasks.v1", 0, offset, b"k", b"v")


def test_watermark_waits_for_the_oldest_session_in_flight() -> None:
    track = PartitionTrack()
    for offset in (3, 4, 7):  # gaps: transaction markers, other groups' aborted records
        track.add(_record(offset))
    assert track.watermark() is None
    track.finish(4)
    assert track.watermark() is None  # 3 is still running: committing 4 would lose it
    track.finish(3)
    upto = track.watermark()
    assert upto is not None and upto.offset == 4
    track.release(upto)
    assert len(track) == 1 and 7 in track and 3 not in track
    track.finish(7)
    last = track.watermark()
    assert last is not None and last.offset == 7


def test_session_id_is_stable_per_client_request_id() -> None:
    assert session_id_for("req-1") == session_id_for("req-1")
    assert session_id_for("req-1") != session_id_for("req-2")
    assert session_id_for("") != session_id_for("")  # no key: a new session every time


def _trajectory(decisions: int, tensor_bytes: int, context_bytes: int) -> trajectory_pb2.Trajectory:
    traj = trajectory_pb2.Trajectory(
        trajectory_id="s", session_id="s", latency=3.0, lower_bound=2.0, completed=True
    )
    traj.task.name = "t"
    traj.task.subtasks.add(id="a", kind="ui", work=1.0)
    for i in range(decisions):
        traj.decisions.add(step=i, observation_tensor=b"o" * tensor_bytes, action_mask=b"m" * 8)
    for i in range(10):
        traj.executions.add(
            execution_id=f"e{i}",
            context=subtask_pb2.ExecutionContext(
                subtask=task_pb2.SubtaskSpec(id="a", description="d" * context_bytes)
            ),
        )
    return traj


def test_a_trajectory_within_the_limit_is_left_alone() -> None:
    traj = _trajectory(5, 100, 100)
    assert fit_trajectory(traj, traj.ByteSize()) is traj


def test_tensors_go_first_and_decisions_stay() -> None:
    traj = _trajectory(200, 5000, 100)
    fitted = fit_trajectory(traj, 100_000)
    assert fitted.ByteSize() <= 100_000
    assert fitted.labels[TRIMMED_LABEL] == "tensors"
    assert len(fitted.decisions) == 200 and not fitted.decisions[0].observation_tensor
    assert TRUNCATED_LABEL not in fitted.labels
    assert traj.decisions[0].observation_tensor  # the original is untouched


def test_decisions_are_cut_last_and_marked_truncated() -> None:
    traj = _trajectory(5000, 10, 1000)
    fitted = fit_trajectory(traj, 20_000)
    assert fitted.ByteSize() <= 20_000
    assert fitted.labels[TRIMMED_LABEL] == "tensors,contexts,decisions"
    assert fitted.labels[TRUNCATED_LABEL] == "true"
    assert 0 < len(fitted.decisions) < 5000
    assert fitted.completed and fitted.latency == 3.0  # the outcome is never dropped


def test_even_a_huge_task_ends_with_a_trajectory() -> None:
    traj = _trajectory(1, 10, 10)
    traj.task.subtasks.add(id="b", kind="ui", work=1.0, description="x" * 50_000)
    fitted = fit_trajectory(traj, 5_000)
    assert fitted.ByteSize() <= 5_000 and fitted.session_id == "s"
    assert fitted.labels[TRIMMED_LABEL].endswith("task")
