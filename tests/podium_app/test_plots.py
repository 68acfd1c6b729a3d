"""The reports' one matplotlib setup (podium_app/plots.py) and the training report's plots that
draw through it without a training run."""

from __future__ import annotations

from pathlib import Path

from podium.v1 import subtask_pb2, trajectory_pb2
from podium_app.plots import pyplot, save
from podium_app.train.report import plot_gantt, plot_policies

PNG = b"\x89PNG\r\n\x1a\n"


def test_save_writes_a_png_at_the_dpi_and_closes_the_figure(tmp_path: Path) -> None:
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"
    sizes = {}
    for dpi in (50, 100):
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.plot([0, 1], [1, 0])
        out = save(fig, tmp_path / f"{dpi}.png", dpi=dpi)
        assert out.read_bytes().startswith(PNG)
        assert fig.number not in plt.get_fignums()  # closed: a report draws many
        sizes[dpi] = out.stat().st_size
    assert sizes[100] > sizes[50]


def test_the_training_reports_plots_draw_through_it(tmp_path: Path) -> None:
    traj = trajectory_pb2.Trajectory(latency=3.0, lower_bound=2.0, completed=True)
    for i, (start, end, outcome) in enumerate(
        [(0.0, 2.0, subtask_pb2.OUTCOME_SUCCESS), (0.5, 3.0, subtask_pb2.OUTCOME_FAILURE)]
    ):
        traj.executions.add(
            execution_id=f"e{i}",
            subtask_id=f"s{i}",
            agent=f"agent-{i}",
            start_time=start,
            end_time=end,
            outcome=outcome,
        )
    plot_gantt(traj, "before", tmp_path / "gantt.png")
    summary = {
        "summary": {
            "cpls": {"ratio_to_bound_mean": 1.2, "completion_rate_mean": 1.0},
            "learned": {"ratio_to_bound_mean": 1.1, "completion_rate_mean": 0.9},
        },
        "tasks": ["t"],
        "config": {"episodes": 2},
    }
    plot_policies(summary, tmp_path / "policies.png")
    for name in ("gantt.png", "policies.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    assert not pyplot().get_fignums()
