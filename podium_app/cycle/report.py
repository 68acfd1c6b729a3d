"""The cycle bench's report: ``latency.png`` (latency/bound per window for each run and each
rule engine, the drift and the promotions marked) and ``report.html`` (the plot, the windows
table, the verdicts, each run's transitions). The plotting setup is :mod:`podium_app.plots`,
the page style the rollout report's (:mod:`podium_app.rollout_report`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from podium_app.plots import pyplot, save
from podium_app.rollout_report import STYLE, _e

SERIES = (
    ("continuous", "continuous (learner + rollout)", "tab:green", "o-"),
    ("frozen", "frozen (initial policy)", "tab:red", "s-"),
    ("frozen_store", "frozen policy, store frozen at the drift", "tab:orange", "^-"),
    ("cpls", "cpls (advertised profiles)", "k", "--"),
    ("cpls_online", "cpls-online (observed profiles)", "tab:gray", ":"),
)
"""Key in a window row, legend, colour, line style."""


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def plot_windows(result: Mapping[str, Any], out: Path) -> None:
    """Mean latency/bound per window (at the window's middle) per run and rule engine."""
    plt = pyplot()
    rows = result["windows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    retrain = result["runs"].get("continuous", {}).get("retrain") or {}
    for key, label, colour, style in SERIES:
        if key == "continuous" and retrain:
            label = "continuous (retraining job + rollout)"
        pts = [
            ((r["start_s"] + r["end_s"]) / 2, r[key]["mean"])
            for r in rows
            if key in r and r[key]["mean"] is not None
        ]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colour, label=label)
    drift_at = result["config"]["drift_at_s"]
    ax.axvline(drift_at, color="tab:orange", lw=2, label=f"drift ({result['config']['drift']})")
    t0 = _first_at(result)
    for t in result["runs"].get("continuous", {}).get("transitions", []):
        if t["kind"] == "PROMOTED" and t0 is not None:
            ax.axvline(t["at"] - t0, color="tab:green", ls=":", lw=1)
    if "announced_at_s" in retrain:
        ax.axvline(retrain["announced_at_s"], color="tab:green", ls="--", lw=1)
    ax.set_xlabel(
        "seconds into the load (window middle; dotted: promotions"
        + ("; dashed: the retrained candidate announced)" if "announced_at_s" in retrain else ")")
    )
    ax.set_ylabel("mean latency / lower bound (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, out)


def _first_at(result: Mapping[str, Any]) -> float | None:
    """Unix time of the continuous run's load start, when recorded."""
    value = result["runs"].get("continuous", {}).get("load_started_at")
    return float(value) if value else None


def table_text(result: Mapping[str, Any]) -> str:
    """The windows table and the verdicts as plain text (the command's stdout)."""
    keys = [k for k, *_ in SERIES if result["windows"] and k in result["windows"][0]]
    lines = ["window  span_s     " + "  ".join(f"{k:>12}" for k in keys)]
    for r in result["windows"]:
        span = f"{r['start_s']:.0f}-{r['end_s']:.0f}"
        cells = "  ".join(f"{_fmt(r[k]['mean']):>12}" for k in keys)
        lines.append(f"{r['window']:>6}  {span:<10} {cells}")
    v = result["verdicts"]
    lines.append(
        "verdicts: "
        + ", ".join(
            f"{k}={_fmt(v.get(k))}"
            for k in (
                "continuous_recovered",
                "continuous_at_or_below_rules",
                "frozen_fails",
                "frozen_store_fails",
                "drift_visible",
                "accepted",
            )
        )
    )
    return "\n".join(lines)


def _windows_html(result: Mapping[str, Any]) -> str:
    keys = [k for k, *_ in SERIES if result["windows"] and k in result["windows"][0]]
    head = "".join(f"<th>{_e(k)} mean</th><th>n</th>" for k in keys)
    body = "".join(
        f"<tr><td>{r['window']}</td><td>{r['start_s']:.0f}-{r['end_s']:.0f}</td>"
        + "".join(f"<td>{_fmt(r[k]['mean'])}</td><td>{r[k]['sessions']}</td>" for k in keys)
        + "</tr>"
        for r in result["windows"]
    )
    return f"<table><tr><th>window</th><th>span s</th>{head}</tr>{body}</table>"


def _retrain_html(retrain: Mapping[str, Any]) -> str:
    """The retraining job's figures (``--retrain-after-s``), or nothing without one."""
    if not retrain:
        return ""
    if "failed" in retrain:
        outcome = f"training failed (exit {retrain['failed']}): no candidate"
    else:
        outcome = (
            f"trained in {retrain['train_s']:g} s; v{_e(retrain['version'])} announced at "
            f"{retrain['announced_at_s']:g} s"
        )
    return (
        f"<p>Retraining job at {retrain['started_at_s']:g} s into the load, on the world the "
        f"run's store saw ({retrain['merges_observed']:g} merges at "
        f"{retrain['observed_merge_factor']:g}&times; their plan): {outcome}.</p>"
    )


def _transitions_html(transitions: list[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{t['seq']}</td><td class=l>{_e(t['kind'].lower())}</td>"
        f"<td class=l>{_e(t['actor'])}</td><td class=l>{_e(t['live'])}</td>"
        f"<td class=l>{_e(t['candidate'] or '-')}</td><td class=l>{_e(t['summary'])}</td></tr>"
        for t in transitions
    )
    return (
        "<table><tr><th>seq</th><th>transition</th><th>actor</th><th>live after</th>"
        f"<th>candidate</th><th>evidence</th></tr>{rows}</table>"
    )


def write_report(result: Mapping[str, Any], out: Path) -> Path:
    """Write ``latency.png`` and ``report.html`` into ``out`` (created); the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    plot_windows(result, out / "latency.png")
    verdicts = "".join(
        f"<tr><td class=l>{_e(k)}</td><td>{_e(_fmt(v))}</td></tr>"
        for k, v in {**result["verdicts"]["levels"], **result["verdicts"]}.items()
        if k != "levels"
    )
    runs = "".join(
        f"<h3>{_e(name)}</h3><p>{r['finished']}/{r['submitted']} sessions finished, "
        f"{r['run_twice']} run twice, {r['incomplete']} incomplete; arms {_e(r['by_arm'])}; "
        f"{r['controller_proposed']} candidates proposed by the controller, {r['promoted']} "
        f"promoted.</p>{_retrain_html(r.get('retrain') or {})}"
        f"{_transitions_html(r['transitions'])}"
        for name, r in result["runs"].items()
    )
    cfg = result["config"]
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Podium cycle bench</title><style>{STYLE}</style></head><body>
<h1>Drift through the safe-shipping cycle</h1>
<p>Drift <code>{_e(cfg["drift"])}</code> at {cfg["drift_at_s"]:g} s of a {cfg["duration_s"]:g} s
load at {cfg["rate"]:g} sessions/s, {cfg["replicas"]} orchestrator replica(s), controller cycle
{cfg["cycle_s"]:g} s, seed {cfg["seed"]}. Runs: mean latency/bound of the sessions the learned
policy decided; rule engines, and the initial policy on a statistics store frozen at the
drift: the same sessions in the simulator on the true pool of their time (docs/cycle.md).</p>
<img src="latency.png">
<h2>Windows</h2>{_windows_html(result)}
<h2>Verdicts</h2><table>{verdicts}</table>
<h2>Runs</h2>{runs}
</body></html>"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


__all__ = ["plot_windows", "table_text", "write_report"]
