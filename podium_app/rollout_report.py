"""``podium rollout report``: the rollout's history as ``report.html`` and PNG plots.

Reads two topics, committed records only, without moving any consumer group:

* the rollout topic (:data:`podium.topics.ROLLOUT`): every ``transition:<seq>`` with its evidence
  and the latest ``state``;
* the scored-trajectory topic: per session its arm (role and version), end time, reward total
  and the guardrail metrics (:func:`podium.rollout.session_metrics`).

and writes into ``--out``:

* ``arms.png`` — share of sessions per arm per time bucket, stage transitions as vertical lines;
* ``guardrails.png`` — each guardrail's canary mean against the baseline mean at every transition
  that carried readings (a breach in red);
* ``shadow.png`` — the paired-difference evidence (candidate - incumbent, with its lower
  confidence bound) of the offline checks and shadow verdicts;
* ``report.html`` — the plots, the transitions table with their evidence, the guardrail tables.

The scored topic can be large (a session carries its decisions), so on Kafka it is read a chunk at
a time and each chunk is reduced to a few numbers per session before the next is read; progress
goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from podium import topics
from podium.errors import ConfigError, DecodeError, PodiumError
from podium_app.commands import fail
from podium_app.plots import pyplot, save

if TYPE_CHECKING:
    from podium.bus import Bus, Record
    from podium.v1 import rollout_pb2

PROG = "podium rollout report"
Say = Callable[[str], None]

GUARDED_KINDS = ("STAGE_ADVANCED", "PROMOTED", "ROLLED_BACK", "OPERATOR_PROMOTED")
"""Transitions whose evidence normally carries guardrail readings."""
PAIRED_KINDS = ("OFFLINE_PASSED", "OFFLINE_FAILED", "SHADOW_PASSED", "SHADOW_FAILED")
"""Transitions whose evidence is a paired candidate-minus-incumbent comparison."""


@dataclass(frozen=True, slots=True)
class SessionRow:
    """What the report needs of one scored session."""

    ended_at: float
    """Unix seconds when the session ended."""
    label: str
    """Its arm, ``<role>:<version>`` (e.g. ``canary:7``)."""
    role: int
    """``podium.v1.ArmRole`` value."""
    reward: float
    """Reward total of the session."""
    metrics: Mapping[str, float]
    """Guardrail metrics (``podium.rollout.session_metrics``)."""


@dataclass(slots=True)
class RolloutHistory:
    """Everything the report shows, decoded from the two topics."""

    transitions: list[rollout_pb2.RolloutTransition] = field(default_factory=list)
    """Every recorded transition, by seq."""
    state: rollout_pb2.RolloutState | None = None
    """The latest state (highest seq), None if the topic holds none."""
    sessions: list[SessionRow] = field(default_factory=list)
    """Scored sessions that ran on a rollout arm, by end time."""
    unrouted: int = 0
    """Scored sessions without an arm (before rollouts, training drivers): not plotted."""
    undecodable: int = 0
    """Records of either topic that are not the expected events (counted, not shown)."""


# -- reading ---------------------------------------------------------------------------------


async def read_chunks(bus: Bus, topic: str, say: Say) -> AsyncIterator[list[Record]]:
    """Committed records of ``topic`` in chunks (Kafka: partition by partition, as read)."""
    from podium.bus import KafkaBus, read_committed

    started = time.monotonic()
    seen = 0
    if isinstance(bus, KafkaBus):
        partitions = await bus.partitions(topic, wait_s=5.0)
        if not partitions:
            say(f"{topic}: no such topic on the broker")
        for p in partitions:
            async for chunk in bus.read_range(topic, p, 0):
                seen += len(chunk)
                if seen // 5000 != (seen - len(chunk)) // 5000:
                    say(f"{topic}: {seen:,} records ({time.monotonic() - started:.0f} s)")
                yield chunk
    else:
        chunk = await read_committed(bus, topic)
        seen = len(chunk)
        yield chunk
    say(f"{topic}: {seen:,} records read in {time.monotonic() - started:.1f} s")


def absorb_rollout(history: RolloutHistory, records: Sequence[Record]) -> None:
    """Add the transitions and the newest state among ``records`` to ``history``."""
    from podium.codec import decode_event
    from podium.v1 import rollout_pb2

    for r in records:
        key = (r.key or b"").decode("utf-8", "replace")
        try:
            if key.startswith("transition:"):
                history.transitions.append(decode_event(r.value, rollout_pb2.RolloutTransition)[1])
            elif key == "state":
                state = decode_event(r.value, rollout_pb2.RolloutState)[1]
                if history.state is None or state.seq >= history.state.seq:
                    history.state = state
        except DecodeError:
            history.undecodable += 1


def absorb_scored(history: RolloutHistory, records: Sequence[Record]) -> None:
    """Reduce the scored sessions among ``records`` to :class:`SessionRow` s in ``history``."""
    from podium.codec import decode_event
    from podium.rollout import session_metrics
    from podium.v1 import reward_pb2, trajectory_pb2

    for r in records:
        try:
            scored = decode_event(r.value, reward_pb2.ScoredTrajectory)[1]
        except DecodeError:
            history.undecodable += 1
            continue
        traj = scored.trajectory
        if traj.arm.role == trajectory_pb2.ARM_ROLE_UNSPECIFIED:
            history.unrouted += 1
            continue
        ended = traj.ended_at if traj.HasField("ended_at") else traj.started_at
        role = trajectory_pb2.ArmRole.Name(traj.arm.role).removeprefix("ARM_ROLE_").lower()
        history.sessions.append(
            SessionRow(
                ended_at=ended.seconds + ended.nanos / 1e9,
                label=traj.labels.get("arm") or f"{role}:{traj.arm.policy_version}",
                role=traj.arm.role,
                reward=scored.total,
                metrics=session_metrics(scored),
            )
        )


async def collect(bus: Bus, rollout_topic: str, scored_topic: str, say: Say) -> RolloutHistory:
    """Read both topics of a started ``bus`` into a :class:`RolloutHistory`."""
    history = RolloutHistory()
    async for chunk in read_chunks(bus, rollout_topic, say):
        absorb_rollout(history, chunk)
    async for chunk in read_chunks(bus, scored_topic, say):
        absorb_scored(history, chunk)
    # Compaction keeps every transition key, but a re-read or a retried write may show one twice.
    by_seq = {t.seq: t for t in history.transitions}
    history.transitions = [by_seq[s] for s in sorted(by_seq)]
    history.sessions.sort(key=lambda s: s.ended_at)
    return history


# -- pure summaries --------------------------------------------------------------------------


def kind_name(kind: int) -> str:
    """``TRANSITION_KIND_SHADOW_PASSED`` -> ``SHADOW_PASSED``."""
    from podium.v1 import rollout_pb2

    try:
        return rollout_pb2.TransitionKind.Name(kind).removeprefix("TRANSITION_KIND_")  # type: ignore[arg-type]
    except ValueError:
        return f"KIND_{kind}"


def bucket_width(sessions: Sequence[SessionRow], buckets: int = 40, per_bucket: int = 25) -> float:
    """A time bucket (seconds) that cuts the sessions' span into at most ``buckets`` parts of
    about ``per_bucket`` sessions or more each (fewer sessions a bucket make a 1% arm noise)."""
    if len(sessions) < 2:
        return 1.0
    span = sessions[-1].ended_at - sessions[0].ended_at
    parts = max(1, min(buckets, len(sessions) // per_bucket))
    # A hair wider than span/parts, so the last session falls in the last bucket.
    return max(span / parts * 1.0001, 1e-3)


def arm_shares(
    sessions: Sequence[SessionRow], width_s: float
) -> tuple[list[float], dict[str, list[float]]]:
    """Per time bucket of ``width_s`` seconds (from the first session): its start, and each
    arm's share of the bucket's sessions. Empty buckets are left out (no share to show)."""
    if width_s <= 0:
        raise ConfigError(f"time bucket must be > 0 s, got {width_s}")
    if not sessions:
        return [], {}
    origin = sessions[0].ended_at
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in sessions:
        counts[int((s.ended_at - origin) // width_s)][s.label] += 1
    labels = sorted({s.label for s in sessions})
    starts = sorted(counts)
    shares = {
        label: [counts[b][label] / sum(counts[b].values()) for b in starts] for label in labels
    }
    return [origin + b * width_s for b in starts], shares


ARM_METRICS = ("incomplete", "failed", "latency_ratio", "decision_ms_p99")
"""Guardrail metrics shown per arm in the arms table (the detectors are in the guardrails)."""


def arm_totals(sessions: Sequence[SessionRow]) -> dict[str, dict[str, float]]:
    """Per arm over the whole history: ``sessions``, mean ``reward`` and the mean of each of
    :data:`ARM_METRICS` (the observed side of the guardrails, whatever the controller logged)."""
    acc: dict[str, list[SessionRow]] = defaultdict(list)
    for s in sessions:
        acc[s.label].append(s)
    out: dict[str, dict[str, float]] = {}
    for label, rows in sorted(acc.items()):
        n = len(rows)
        figures = {"sessions": float(n), "reward": sum(r.reward for r in rows) / n}
        for m in ARM_METRICS:
            figures[m] = sum(r.metrics.get(m, 0.0) for r in rows) / n
        out[label] = figures
    return out


def _unix(ts: object) -> float:
    seconds = getattr(ts, "seconds", 0)
    nanos = getattr(ts, "nanos", 0)
    return float(seconds) + float(nanos) / 1e9


def _stamp(unix: float) -> str:
    if unix <= 0:
        return "-"
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S")


# -- plots -----------------------------------------------------------------------------------


def plot_arms(history: RolloutHistory, width_s: float, out: Path) -> None:
    """Share of sessions per arm per time bucket; transitions as labelled vertical lines."""
    plt = pyplot()
    starts, shares = arm_shares(history.sessions, width_s)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    # Each bucket drawn to its end: the last one needs an end point of its own.
    ends = [*starts, starts[-1] + width_s] if starts else []
    when = [datetime.fromtimestamp(t, UTC) for t in ends]
    shares = {label: [*v, v[-1]] for label, v in shares.items()}
    if shares:
        # Stacked: each bucket's arms add up to all of its sessions.
        ax.stackplot(when, *shares.values(), labels=list(shares), step="post", alpha=0.85)
    for t in history.transitions:
        at = datetime.fromtimestamp(_unix(t.at), UTC)
        ax.axvline(at, color="k", ls=":", lw=0.8)
        ax.text(at, 1.02, kind_name(t.kind).lower(), rotation=90, fontsize=6, va="bottom")
    ax.set_ylim(0, 1.0)
    ax.set_ylabel(f"share of sessions per {width_s:.3g} s bucket")
    ax.set_xlabel("session end (UTC)")
    if shares:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    else:
        ax.text(0.5, 0.5, "no routed sessions", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    save(fig, out)


def guarded(history: RolloutHistory) -> list[rollout_pb2.RolloutTransition]:
    """Transitions that carry guardrail readings."""
    return [t for t in history.transitions if t.evidence.guardrails]


def plot_guardrails(history: RolloutHistory, out: Path) -> None:
    """One panel per guardrail: canary and baseline means at each transition with readings."""
    plt = pyplot()
    rows = guarded(history)
    names = sorted({g.name for t in rows for g in t.evidence.guardrails})
    cols = min(3, max(len(names), 1))
    nrows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        xs = [f"#{t.seq}" for t in rows]
        readings = [{g.name: g for g in t.evidence.guardrails}.get(name) for t in rows]
        idx = list(range(len(rows)))
        canary = [g.canary_mean if g else math.nan for g in readings]
        base = [g.baseline_mean if g else math.nan for g in readings]
        ax.bar([i - 0.2 for i in idx], canary, width=0.4, label="canary", color="tab:orange")
        ax.bar([i + 0.2 for i in idx], base, width=0.4, label="baseline", color="tab:gray")
        for i, g in enumerate(readings):
            if g is not None and g.breached:
                ax.text(i, max(canary[i], base[i]), "breach", color="red", ha="center", fontsize=7)
        ax.set_xticks(idx, xs, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if not names:
        axes.flat[0].text(0.5, 0.5, "no guardrail readings recorded", ha="center")
    else:
        axes.flat[0].legend(fontsize=7)
    fig.suptitle("guardrails: canary vs baseline mean at each transition (x: transition seq)")
    save(fig, out)


def paired(history: RolloutHistory) -> list[rollout_pb2.RolloutTransition]:
    """Offline and shadow verdicts (their evidence is a paired comparison)."""
    return [t for t in history.transitions if kind_name(t.kind) in PAIRED_KINDS]


def paired_figures(figures: Mapping[str, float]) -> tuple[float, float]:
    """(mean paired difference, its lower confidence bound) of a verdict's figures; NaN for
    what the evidence does not give. The offline check records ``paired_mean``; a shadow
    verdict the mean over its window (``running_mean``) and ``lower_bound``."""
    for name in ("paired_mean", "running_mean", "mean"):
        if name in figures:
            return figures[name], figures.get("lower_bound", math.nan)
    return math.nan, figures.get("lower_bound", math.nan)


def plot_shadow(history: RolloutHistory, out: Path) -> None:
    """Paired mean (candidate - incumbent) with its lower bound, per offline/shadow verdict."""
    plt = pyplot()
    rows = paired(history)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for i, t in enumerate(rows):
        mean, low = paired_figures(t.evidence.figures)
        ok = kind_name(t.kind).endswith("PASSED")
        ax.plot([i], [mean], "o", color="tab:green" if ok else "tab:red")
        if not math.isnan(low) and not math.isnan(mean):
            ax.vlines(i, low, mean, color="tab:green" if ok else "tab:red")
            ax.plot([i], [low], "_", color="k", markersize=12)
    ax.axhline(0.0, color="k", lw=0.8)
    ticks = [
        f"#{t.seq} {kind_name(t.kind).lower()}\ncandidate "
        f"{t.previous.candidate_version or t.state.candidate_version}, "
        f"n={t.evidence.figures.get('sessions', math.nan):.0f}"
        for t in rows
    ]
    ax.set_xticks(list(range(len(rows))), ticks, fontsize=7)
    ax.set_xlim(-0.5, max(len(rows), 1) - 0.5)
    ax.set_ylabel("paired return: candidate - incumbent")
    ax.set_title("offline check and shadow: mean paired difference (dot) and lower bound (bar)")
    if not rows:
        ax.text(
            0.5, 0.5, "no offline or shadow verdicts recorded", ha="center", transform=ax.transAxes
        )
    ax.grid(alpha=0.3)
    save(fig, out)


# -- HTML ------------------------------------------------------------------------------------

STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;font-size:13px}"
    "td.l{text-align:left}img{max-width:100%}.breach{color:#c00;font-weight:bold}"
)


def _e(text: object) -> str:
    return html.escape(str(text))


def _figures(figures: Mapping[str, float]) -> str:
    return "<br>".join(f"{_e(k)} = {v:.6g}" for k, v in sorted(figures.items()))


def transitions_table(history: RolloutHistory) -> str:
    """Every transition with its evidence, oldest first."""
    from podium.rollout import stage_name

    rows = []
    for t in history.transitions:
        rows.append(
            f"<tr><td>{t.seq}</td><td class=l>{_stamp(_unix(t.at))}</td>"
            f"<td class=l>{_e(kind_name(t.kind).lower())}</td>"
            f"<td class=l>{_e(stage_name(t.state))}</td>"
            f"<td class=l>{_e(t.state.live_version)}</td>"
            f"<td class=l>{_e(t.state.candidate_version or '-')}</td>"
            f"<td class=l>{_e(t.actor)}</td><td class=l>{_e(t.reason)}</td>"
            f"<td class=l>{_e(t.evidence.summary)}</td>"
            f"<td class=l>{_figures(t.evidence.figures)}</td></tr>"
        )
    return (
        "<table><tr><th>seq</th><th>at (UTC)</th><th>transition</th><th>stage after</th>"
        "<th>live</th><th>candidate</th><th>actor</th><th>reason</th><th>evidence</th>"
        "<th>figures</th></tr>" + "".join(rows) + "</table>"
    )


def guardrail_tables(history: RolloutHistory) -> str:
    """One table of readings per transition that carried guardrails."""
    parts = []
    for t in guarded(history):
        rows = "".join(
            f"<tr><td class=l>{_e(g.name)}</td><td>{g.canary_mean:.4f}</td>"
            f"<td>{g.baseline_mean:.4f}</td><td>{g.canary_n}</td><td>{g.baseline_n}</td>"
            f"<td>{g.margin:.4f}</td><td>{g.statistic:.3f}</td><td>{g.threshold:.3f}</td>"
            f"<td{' class=breach' if g.breached else ''}>{'yes' if g.breached else 'no'}</td></tr>"
            for g in t.evidence.guardrails
        )
        parts.append(
            f"<h3>#{t.seq} {_e(kind_name(t.kind).lower())} ({_e(_stamp(_unix(t.at)))})</h3>"
            "<table><tr><th>guardrail</th><th>canary mean</th><th>baseline mean</th>"
            "<th>canary n</th><th>baseline n</th><th>margin</th><th>log LR</th>"
            "<th>threshold</th><th>breached</th></tr>" + rows + "</table>"
        )
    return "".join(parts) or "<p>No transition carried guardrail readings.</p>"


def arms_table(history: RolloutHistory) -> str:
    """Sessions, mean reward and mean guardrail metrics per arm."""
    rows = "".join(
        f"<tr><td class=l>{_e(label)}</td><td>{int(f['sessions']):,}</td>"
        f"<td>{f['reward']:.4f}</td>"
        + "".join(f"<td>{f[m]:.4f}</td>" for m in ARM_METRICS)
        + "</tr>"
        for label, f in arm_totals(history.sessions).items()
    )
    heads = "".join(f"<th>{_e(m)}</th>" for m in ARM_METRICS)
    return f"<table><tr><th>arm</th><th>sessions</th><th>mean reward</th>{heads}</tr>{rows}</table>"


def _state_line(state: rollout_pb2.RolloutState | None) -> str:
    from podium.rollout import stage_name

    if state is None:
        return "No rollout state on the topic yet (every session runs on the cold start)."
    return (
        f"Now: <b>{_e(stage_name(state))}</b>{' (paused)' if state.paused else ''}, "
        f"live <code>{_e(state.live_version)}</code>, candidate "
        f"<code>{_e(state.candidate_version or '-')}</code>, previous "
        f"<code>{_e(state.previous_version or '-')}</code>, state seq {state.seq}, cycle "
        f"{state.cycle}."
    )


def write_report(history: RolloutHistory, out: Path, *, bucket_s: float | None = None) -> Path:
    """Write the plots and ``report.html`` into ``out`` (created); returns the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    width = bucket_s if bucket_s is not None else bucket_width(history.sessions)
    plot_arms(history, width, out / "arms.png")
    plot_guardrails(history, out / "guardrails.png")
    plot_shadow(history, out / "shadow.png")
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Podium rollout report</title><style>{STYLE}</style></head><body>
<h1>Podium rollout report</h1>
<p>{_state_line(history.state)}</p>
<p>{len(history.transitions)} transitions, {len(history.sessions):,} routed sessions
({history.unrouted:,} sessions without an arm not shown; {history.undecodable} records not
decodable).</p>
<h2>Arms over time</h2><img src="arms.png">{arms_table(history)}
<h2>Stage transitions</h2>{transitions_table(history)}
<h2>Guardrails</h2><img src="guardrails.png">{guardrail_tables(history)}
<h2>Shadow evidence</h2>
<p>Each offline check and shadow verdict: the mean paired difference of twin returns
(candidate - incumbent, same task, pool and seed) and its one-sided lower confidence bound.</p>
<img src="shadow.png">
</body></html>"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


# -- the command -----------------------------------------------------------------------------


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium rollout report``."""
    parser.add_argument("--bus", default="", help="kafka://HOST:PORT (default: $PODIUM_BUS)")
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the report")
    parser.add_argument(
        "--topic-suffix",
        default="",
        metavar="TAG",
        help="read a run's private scored topic (<scored>.<TAG>, as podium train names it)",
    )
    parser.add_argument("--rollout-topic", default=topics.ROLLOUT, help="rollout topic")
    parser.add_argument(
        "--bucket-s", type=float, default=None, help="time bucket of the arms plot (default: auto)"
    )


def _scored_topic(suffix: str) -> str:
    from podium_app.train.services import RunTopics

    return RunTopics.private(suffix).scored if suffix else topics.SCORED_TRAJECTORIES


async def _collect_from(url: str, rollout_topic: str, scored_topic: str) -> RolloutHistory:
    from podium.bus import connect, is_kafka_url

    if not is_kafka_url(url):
        raise ConfigError(
            f"--bus must be kafka://HOST:PORT (the topics of a running deployment), got {url!r}"
        )
    bus = connect(url)
    await bus.start()
    try:
        return await collect(bus, rollout_topic, scored_topic, _say)
    finally:
        await bus.stop()


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def run_report(args: argparse.Namespace) -> int:
    """Read the topics and write the report; 0 done, 2 bad input, 1 on a bus failure."""
    url = args.bus or os.environ.get("PODIUM_BUS", "")
    try:
        if args.bucket_s is not None and args.bucket_s <= 0:
            raise ConfigError(f"--bucket-s must be > 0, got {args.bucket_s}")
        scored = _scored_topic(args.topic_suffix)
        history = asyncio.run(_collect_from(url, args.rollout_topic, scored))
        path = write_report(history, Path(args.out), bucket_s=args.bucket_s)
    except PodiumError as exc:
        return fail(PROG, exc)
    except OSError as exc:
        print(f"{PROG}: --out {args.out}: cannot write ({exc.strerror})", file=sys.stderr)
        return 2
    print(path)
    return 0
