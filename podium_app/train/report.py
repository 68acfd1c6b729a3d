"""The training report: PNG plots and ``report.html`` in the run directory.

* ``learning_curve.png`` — validation latency/bound of each evaluated version against cpls's,
  the sampled training sessions' latency/bound, and the reward service's mean total;
* ``losses.png`` — PPO's policy/value loss, entropy, approximate KL, clip fraction;
* ``policies.png`` — held-out latency/bound and completion per policy (the final table);
* ``gantt_before.png`` / ``gantt_after.png`` — one held-out session run by the untrained
  network and by the trained one: each bar is a sub-agent execution on its lane.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.v1 import subtask_pb2, trajectory_pb2
from podium_app.plots import pyplot, save

if TYPE_CHECKING:
    from podium_app.train.config import TrainResult

POLICY_ORDER = ("sequential", "greedy", "cpls", "cpls-online", "learned")


def plot_learning_curve(result: TrainResult, out: Path) -> None:
    """Validation and training latency/bound per iteration, and the mean reward."""
    plt = pyplot()
    hist = result.history
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    its = [h.iteration for h in hist if not math.isnan(h.train_ratio)]
    ax1.plot(
        its,
        [h.train_ratio for h in hist if not math.isnan(h.train_ratio)],
        alpha=0.5,
        label="training sessions (sampled)",
    )
    val = [(h.iteration, h.val_ratio) for h in hist if h.val_ratio is not None]
    ax1.plot([v[0] for v in val], [v[1] for v in val], "o-", label="validation (greedy)")
    ax1.axhline(result.cpls_val_ratio, color="k", ls="--", label="cpls on validation")
    ax1.set_xlabel("PPO iteration (0 = after behaviour cloning)")
    ax1.set_ylabel("latency / lower bound (lower is better)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.plot(
        its, [h.reward_total for h in hist if not math.isnan(h.train_ratio)], color="tab:green"
    )
    ax2.set_xlabel("PPO iteration")
    ax2.set_ylabel("reward_svc total (mean per session)")
    ax2.grid(alpha=0.3)
    save(fig, out, dpi=110)


def plot_losses(result: TrainResult, out: Path) -> None:
    """PPO statistics per iteration."""
    plt = pyplot()
    rows = [h for h in result.history if h.stats]
    keys = ("pg_loss", "v_loss", "entropy", "approx_kl", "clip_fraction", "lr")
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, k in zip(axes.flat, keys, strict=True):
        ax.plot([h.iteration for h in rows], [h.stats.get(k, math.nan) for h in rows])
        ax.set_title(k)
        ax.grid(alpha=0.3)
    save(fig, out)


def plot_policies(summary: dict[str, Any], out: Path) -> None:
    """Held-out latency/bound and completion rate per policy."""
    plt = pyplot()
    names = [n for n in POLICY_ORDER if n in summary["summary"]]
    s = summary["summary"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    palette = {"cpls-online": "tab:purple", "learned": "tab:green"}
    colors = [
        palette.get(n, c)
        for n, c in zip(
            names, ["tab:gray", "tab:orange", "tab:blue"] + ["tab:green"] * 2, strict=False
        )
    ]
    ax1.bar(names, [s[n]["ratio_to_bound_mean"] for n in names], color=colors)
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_ylabel("mean latency / lower bound")
    ax1.set_yscale("log")
    for i, n in enumerate(names):
        ax1.text(
            i,
            s[n]["ratio_to_bound_mean"],
            f"{s[n]['ratio_to_bound_mean']:.3f}",
            ha="center",
            va="bottom",
        )
    ax2.bar(names, [s[n]["completion_rate_mean"] for n in names], color=colors)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("completion rate")
    fig.suptitle(
        f"held-out tasks ({len(summary['tasks'])}), {summary['config']['episodes']} sessions each"
    )
    save(fig, out, dpi=110)


def plot_gantt(traj: trajectory_pb2.Trajectory, title: str, out: Path) -> None:
    """Sub-agent executions on lanes (first free lane at start time)."""
    plt = pyplot()
    execs = sorted(traj.executions, key=lambda e: (e.start_time, e.execution_id))
    lanes: list[float] = []
    placed = []
    for e in execs:
        lane = next((i for i, end in enumerate(lanes) if end <= e.start_time + 1e-9), None)
        if lane is None:
            lanes.append(0.0)
            lane = len(lanes) - 1
        lanes[lane] = e.end_time
        placed.append((lane, e))
    agents = sorted({e.agent for e in execs})
    from matplotlib.patches import Rectangle

    cmap = plt.get_cmap("tab10")
    color = {a: cmap(i % 10) for i, a in enumerate(agents)}
    fig, ax = plt.subplots(figsize=(11, 0.5 * max(len(lanes), 2) + 1.5))
    for lane, e in placed:
        failed = e.outcome != subtask_pb2.OUTCOME_SUCCESS
        ax.barh(
            lane,
            e.end_time - e.start_time,
            left=e.start_time,
            color=color[e.agent],
            edgecolor="red" if failed else "black",
            hatch="//" if failed else None,
            lw=0.6,
        )
        if e.end_time - e.start_time > traj.latency / 40:
            ax.text(
                (e.start_time + e.end_time) / 2,
                lane,
                e.subtask_id,
                ha="center",
                va="center",
                fontsize=6,
            )
    ax.axvline(traj.lower_bound, color="k", ls="--", lw=1)
    ax.set_xlabel("simulated time")
    ax.set_ylabel("concurrent sub-agent")
    ax.set_title(
        f"{title}: latency {traj.latency:.2f}, bound {traj.lower_bound:.2f} "
        f"(x{traj.latency / traj.lower_bound:.2f}), {'completed' if traj.completed else 'incomplete'}"
    )
    handles = [Rectangle((0, 0), 1, 1, color=color[a]) for a in agents]
    ax.legend(handles, agents, fontsize=7, loc="upper right", ncol=2)
    save(fig, out)


def _table(summary: dict[str, Any]) -> str:
    rows = []
    for n in POLICY_ORDER:
        s = summary["summary"].get(n)
        if s is None:
            continue
        rows.append(
            f"<tr><td>{n}</td><td>{s['ratio_to_bound_mean']:.3f}</td>"
            f"<td>{s['completion_rate_mean']:.3f}</td><td>{s['reduction_vs_sequential_mean']:.1%}</td>"
            f"<td>{s['latency_mean']:.2f}</td></tr>"
        )
    return (
        "<table><tr><th>policy</th><th>latency / bound</th><th>completion</th>"
        "<th>reduction vs sequential</th><th>mean latency</th></tr>" + "".join(rows) + "</table>"
    )


def _names(names: list[str]) -> str:
    """A list of task or agent names, folded when long."""
    text = html.escape(", ".join(names))
    if len(names) <= 12:
        return text
    return f"<details><summary>{len(names)} names</summary>{text}</details>"


def _pool_row(pool: dict[str, Any]) -> str:
    truth = "no"
    if pool["true_profiles"]:
        counts = Counter(pool.get("deviations", {}).values())
        ways = ", ".join(
            f"{counts[w]} {w}"
            for w in ("slower", "flakier", "better", "mixed", "honest")
            if counts[w]
        )
        truth = f"yes, the simulator draws from them ({ways})"
    return (
        f"<tr><td>{html.escape(pool['name'])}</td><td>{html.escape(pool['source'])}</td>"
        f"<td>{len(pool['agents'])}</td><td style='text-align:left'>{_names(pool['agents'])}"
        f"</td><td>{truth}</td></tr>"
    )


def trained_on(training: dict[str, Any]) -> str:
    """The report's "Trained on" section: the pool (name, file, agents, true profiles), its
    variants, and the tasks (source, counts, names, how the final table's were chosen)."""
    pools = [training["pool"], *training["variants"]]
    tasks = training["tasks"]
    source = "generated (seeded suites over the pool's kinds)"
    if tasks["source"] != "generated":
        source = f"<code>{html.escape(tasks['source'])}</code>"
    variants = (
        f"<p>Each training session ran on one of these {len(pools)} pools, drawn uniformly "
        "(the variants: renamed agents, other counts, true profiles slower, flakier or better "
        "than advertised); validation and the table above ran on the first.</p>"
        if training["variants"]
        else ""
    )
    return f"""<h2>Trained on</h2>
<table><tr><th>pool</th><th>file</th><th>agents</th><th>names</th><th>true profiles</th></tr>
{"".join(_pool_row(p) for p in pools)}</table>{variants}
<p>Tasks: {source}, {tasks["count"]} in all: {len(tasks["train"])} for training
({_names(tasks["train"])}), {len(tasks["validation"])} for validation
({_names(tasks["validation"])}); the table's held-out tasks: {html.escape(tasks["held_out"])}
({_names(tasks["test"])}).</p>"""


def headline(summary: dict[str, Any]) -> str:
    """One line naming the pool and the tasks of a run (plain text; the CLI prints it too)."""
    training = summary["config"].get("training")
    if training is None:
        return ""
    pool, tasks = training["pool"], training["tasks"]
    variants = f" + {len(training['variants'])} variants" if training["variants"] else ""
    truth = ", true profiles hidden from the planners" if pool["true_profiles"] else ""
    return (
        f"pool {pool['name']} ({pool['source']}, {len(pool['agents'])} agents{truth}){variants}; "
        f"tasks {tasks['source']} ({tasks['count']}; held out: {tasks['held_out']})"
    )


def write_report(
    result: TrainResult, before: trajectory_pb2.Trajectory, after: trajectory_pb2.Trajectory
) -> Path:
    """Write the plots and ``report.html``; returns the HTML path."""
    d = result.run_dir
    plot_learning_curve(result, d / "learning_curve.png")
    plot_losses(result, d / "losses.png")
    plot_policies(result.summary, d / "policies.png")
    untrained = "the --init policy" if not result.bc_history else "untrained network"
    plot_gantt(before, f"before training ({untrained})", d / "gantt_before.png")
    plot_gantt(after, f"after training (v{result.best_version})", d / "gantt_after.png")
    start = (
        f"behaviour cloning accuracy {result.bc_history[-1]['bc_accuracy']:.3f}"
        if result.bc_history
        else "started from a trained policy (<code>--init</code>, no cloning)"
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Podium training report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}img{{max-width:100%}}</style></head><body>
<h1>Podium training report</h1>
<p>Run <code>{html.escape(str(d))}</code>: {result.wall_s / 60:.1f} min wall time,
{start},
{len(result.history) - 1} PPO iterations, best version v{result.best_version}
(chosen on the validation split; cpls there: {result.cpls_val_ratio:.3f}).<br>
Trained on {html.escape(headline(result.summary))}.</p>
<h2>Held-out tasks</h2>{_table(result.summary)}
<p>Same (task, seed) sessions for every policy; the learned policy acts greedily.</p>
<img src="policies.png">
{trained_on(result.summary["config"]["training"]) if "training" in result.summary["config"] else ""}
<h2>Learning curves</h2><img src="learning_curve.png"><img src="losses.png">
<h2>One session before and after training</h2>
<img src="gantt_before.png"><img src="gantt_after.png">
<p>TensorBoard: <code>tensorboard --logdir {html.escape(str(d / "tb"))}</code>.
Numbers: <code>summary.json</code> (the JSON shape of <code>podium bench scheduling</code>).</p>
</body></html>"""
    out = d / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
