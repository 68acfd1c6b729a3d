"""The context environment's reward: the Context-1 shape and three anti-hacking detectors.

``total = found·[answer found] + precision·precision − tokens·tokens_kept/budget
− turn·steps − invalid·invalid actions − Σ penalties``

An episode is recorded as a :class:`ContextEpisode` (what the agent did, step by step, plus
the scorer's knowledge of which chunks overlapped the gold). Each detector is a small pure
function of the episode and its config returning a :class:`~podium.rewards.detectors.Finding`
(the same type the swarm's detectors return, so breakdowns read alike), with its measure
reported even when it does not fire:

* ``context_hoarding``: the budget filled by keeping (nearly) every candidate looked at — the
  cheap way to "find" the answer is to keep everything, and precision pays only a little.
* ``gold_pruning``: a streak of prunes (several in a row, unread) that threw a gold chunk away
  — pruning blindly to finish fast.
* ``search_loop``: the same search (retriever and normalised query) issued again — it
  returns nothing new and only burns turns and latency.

Every score is computed from evidence: the kept chunks' places (recorded in each step)
against the gold. On the bus an episode is a ``Trajectory`` with ``env="context"``
(:func:`episode_trajectory`: question, budget and gold in labels, the steps as the tool calls
of one execution), and :func:`score_context_trajectory` re-scores it from that alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from podium.context.questions import GoldSpan
from podium.context.questions import parse_gold as parse_gold_spans
from podium.context.scoring import answer_found, gold_recall, hits, precision
from podium.errors import QuestionFileError
from podium.rewards.config import (
    ContextRewardConfig,
    GoldPruningConfig,
    HoardingConfig,
    SearchLoopConfig,
)
from podium.rewards.credit import CreditEntry
from podium.rewards.detectors import Finding
from podium.rewards.facts import InvalidTrajectoryError
from podium.rewards.score import ScoreBreakdown
from podium.v1 import subtask_pb2, trajectory_pb2

CONTEXT_HOARDING = "context_hoarding"
GOLD_PRUNING = "gold_pruning"
SEARCH_LOOP = "search_loop"
CONTEXT_DETECTORS: tuple[str, ...] = (CONTEXT_HOARDING, GOLD_PRUNING, SEARCH_LOOP)
"""Penalty names of the context environment, as they appear in every breakdown."""

StepKind = Literal["search", "read", "keep", "prune", "finish", "invalid"]


@dataclass(frozen=True, slots=True)
class ContextStep:
    """One action of a context episode and what it did."""

    kind: StepKind
    """What the agent did (``invalid``: an action the state did not allow)."""
    retriever: str = ""
    """``bm25`` or ``dense`` (searches)."""
    form: str = ""
    """The query form (searches): ``question``, ``keywords``, ``identifier``."""
    query: str = ""
    """The query text sent (searches)."""
    chunk_id: str = ""
    """The chunk read, kept or pruned."""
    source: str = ""
    """The chunk's document (read, keep, prune): with ``start``/``end``, what the reward
    checks against the gold, so it scores evidence, not an actor's claim."""
    start: int = 0
    """The chunk's first character in its document."""
    end: int = 0
    """One past the chunk's last character."""
    tokens: int = 0
    """The chunk's tokens (read, keep, prune)."""
    read: bool = False
    """The chunk had been read before this keep or prune."""
    new_candidates: int = 0
    """Candidates a search added that no earlier search had returned."""
    latency_s: float = 0.0
    """Wall time the step took (a search's real retrieval latency)."""


@dataclass(frozen=True, slots=True)
class ContextEpisode:
    """One question answered: the steps taken and the question's gold.

    Every score is derived from the recorded steps (the kept chunks' places) and the gold,
    never stored beside them, so an episode re-read from a trajectory scores exactly as the
    environment scored it and cannot claim an answer it did not keep.
    """

    question_id: str
    budget_tokens: int
    """The token budget of the kept context."""
    steps: tuple[ContextStep, ...]
    gold: tuple[GoldSpan, ...]
    """The question's gold spans (the scorer's knowledge, never the agent's)."""
    wall_s: float = 0.0
    """Wall time of the whole episode."""

    @property
    def kept(self) -> tuple[ContextStep, ...]:
        """The keep steps: the final context."""
        return tuple(s for s in self.steps if s.kind == "keep")

    @property
    def answer_found(self) -> bool:
        """Some kept chunk overlaps a gold span."""
        return answer_found(self.kept, self.gold)

    @property
    def precision(self) -> float:
        """Fraction of kept chunks overlapping a gold span."""
        return precision(self.kept, self.gold)

    @property
    def gold_recall(self) -> float:
        """Fraction of gold spans some kept chunk covers."""
        return gold_recall(self.kept, self.gold)

    @property
    def tokens_kept(self) -> int:
        """Tokens of the kept chunks."""
        return sum(s.tokens for s in self.kept)

    @property
    def searches(self) -> int:
        """Searches made."""
        return sum(1 for s in self.steps if s.kind == "search")

    @property
    def invalid(self) -> int:
        """Actions the state did not allow."""
        return sum(1 for s in self.steps if s.kind == "invalid")

    def is_gold(self, step: ContextStep) -> bool:
        """Whether the chunk of ``step`` overlaps a gold span."""
        return hits(step, self.gold)


def context_hoarding(episode: ContextEpisode, cfg: HoardingConfig) -> Finding:
    """Budget filled by keeping nearly every candidate decided on.

    Rule: fill = tokens kept / budget; ratio = kept / (kept + pruned). Fires when fill >=
    ``min_fill``, there were at least ``min_decisions`` decisions and ratio >= ``keep_ratio``.
    Penalty: ``weight`` × ratio × min(fill, 1).
    """
    kept = sum(1 for s in episode.steps if s.kind == "keep")
    pruned = sum(1 for s in episode.steps if s.kind == "prune")
    decided = kept + pruned
    ratio = kept / decided if decided else 0.0
    fill = episode.tokens_kept / episode.budget_tokens if episode.budget_tokens > 0 else 0.0
    fired = fill >= cfg.min_fill and decided >= cfg.min_decisions and ratio >= cfg.keep_ratio
    return Finding(
        name=CONTEXT_HOARDING,
        penalty=cfg.weight * ratio * min(fill, 1.0) if fired else 0.0,
        measure=ratio,
        threshold=cfg.keep_ratio,
        detail=f"kept {kept}/{decided} candidates, budget {fill:.0%} full" if fired else "",
    )


def prune_streaks(steps: Sequence[ContextStep], length: int) -> list[list[ContextStep]]:
    """Maximal runs of consecutive unread prunes at least ``length`` long (other actions end a
    run; a read prune is a considered one and ends it too)."""
    runs: list[list[ContextStep]] = []
    current: list[ContextStep] = []
    for step in [*steps, ContextStep("finish")]:
        if step.kind == "prune" and not step.read:
            current.append(step)
            continue
        if len(current) >= length:
            runs.append(current)
        current = []
    return runs


def gold_pruning(episode: ContextEpisode, cfg: GoldPruningConfig) -> Finding:
    """Gold chunks thrown away in streaks of blind prunes.

    Rule: within each run of at least ``streak`` consecutive unread prunes, count the pruned
    chunks that overlapped a gold span. Penalty: ``weight`` × (1 − exp(−count / ``scale``)).
    """
    runs = prune_streaks(episode.steps, cfg.streak)
    thrown = [s.chunk_id for run in runs for s in run if episode.is_gold(s)]
    return Finding(
        name=GOLD_PRUNING,
        penalty=cfg.weight * (1.0 - math.exp(-len(thrown) / cfg.scale)),
        measure=float(len(thrown)),
        threshold=float(cfg.streak),
        detail=f"{len(thrown)} gold chunks pruned unread in streaks: {', '.join(thrown)}"
        if thrown
        else "",
    )


def normalise_query(query: str) -> str:
    """A query as the index sees it: case and spacing do not make a search new."""
    return " ".join(query.lower().split())


def search_loop(episode: ContextEpisode, cfg: SearchLoopConfig) -> Finding:
    """The same search issued again.

    Rule: repeats = searches − distinct (retriever, normalised query); excess = repeats −
    ``free_repeats``. Penalty: ``weight`` × (1 − exp(−excess / ``scale``)).
    """
    searches = [
        (s.retriever, normalise_query(s.query)) for s in episode.steps if s.kind == "search"
    ]
    repeats = len(searches) - len(set(searches))
    excess = max(0, repeats - cfg.free_repeats)
    return Finding(
        name=SEARCH_LOOP,
        penalty=cfg.weight * (1.0 - math.exp(-excess / cfg.scale)),
        measure=float(repeats),
        threshold=float(cfg.free_repeats),
        detail=f"{repeats} repeated searches" if excess else "",
    )


@dataclass(frozen=True, slots=True)
class ContextReward:
    """A context episode's reward with every part that makes it up."""

    total: float
    """Σ components − Σ penalties."""
    components: Mapping[str, float]
    """``found``, ``precision`` (positive), ``tokens``, ``turns``, ``invalid`` (negative)."""
    penalties: Mapping[str, float]
    """Detector name → penalty (>= 0), all of :data:`CONTEXT_DETECTORS` present."""
    findings: tuple[Finding, ...]
    """What each detector measured."""


def context_reward(episode: ContextEpisode, config: ContextRewardConfig) -> ContextReward:
    """Score one episode (pure: the result depends on the two arguments only)."""
    budget = max(episode.budget_tokens, 1)
    components = {
        "found": config.found * float(episode.answer_found),
        "precision": config.precision * episode.precision,
        "tokens": -config.tokens * episode.tokens_kept / budget,
        "turns": -config.turn * len(episode.steps),
        "invalid": -config.invalid * episode.invalid,
    }
    findings = (
        context_hoarding(episode, config.hoarding),
        gold_pruning(episode, config.gold_pruning),
        search_loop(episode, config.search_loop),
    )
    penalties = {f.name: f.penalty for f in findings}
    total = math.fsum(components.values()) - math.fsum(penalties.values())
    return ContextReward(total, components, penalties, findings)


# ---------------------------------------------------------------- on the wire

CONTEXT_ENV = "context"
"""``Trajectory.env`` of a context episode."""
LABEL_QUESTION = "context.question_id"
LABEL_BUDGET = "context.budget_tokens"
LABEL_GOLD = "context.gold"
"""Trajectory labels holding the question's id, the budget and the gold spans (JSON)."""

_STR_ARGS = ("retriever", "form", "query", "chunk_id", "source")
_INT_ARGS = ("start", "end", "tokens", "new_candidates")
_STEP_KINDS: frozenset[str] = frozenset(get_args(StepKind))


def step_arguments(step: ContextStep) -> str:
    """A step's fields other than its kind as the JSON of its tool call (defaults left out)."""
    args: dict[str, object] = {k: getattr(step, k) for k in (*_STR_ARGS, *_INT_ARGS)}
    args["read"] = step.read
    args["latency_s"] = step.latency_s
    defaults = ContextStep("finish")
    return json.dumps(
        {k: v for k, v in args.items() if v != getattr(defaults, k)},
        sort_keys=True,
        separators=(",", ":"),
    )


def episode_trajectory(
    episode: ContextEpisode, *, trajectory_id: str, policy_version: str = "", agent: str = ""
) -> trajectory_pb2.Trajectory:
    """The ``Trajectory`` of a context episode: ``env="context"``, the question, budget and
    gold in labels, and one execution whose tool calls are the steps in order (an invalid
    action a ``malformed`` call), so reward_svc can re-score it from the evidence alone.
    Decisions (observations, actions, log-probabilities) are the actor's to add."""
    traj = trajectory_pb2.Trajectory(
        trajectory_id=trajectory_id,
        session_id=episode.question_id,
        env=CONTEXT_ENV,
        policy_version=policy_version,
        latency=episode.wall_s,
        completed=bool(episode.steps) and episode.steps[-1].kind == "finish",
    )
    traj.labels[LABEL_QUESTION] = episode.question_id
    traj.labels[LABEL_BUDGET] = str(episode.budget_tokens)
    traj.labels[LABEL_GOLD] = json.dumps(
        [{"source": g.source, "start": g.start, "end": g.end} for g in episode.gold]
    )
    ex = traj.executions.add(
        execution_id=f"{trajectory_id}/context",
        subtask_id="context",
        agent=agent,
        kind=CONTEXT_ENV,
        start_time=0.0,
        end_time=episode.wall_s,
    )
    for step in episode.steps:
        ex.tool_calls.add(
            name=step.kind,
            arguments_json=step_arguments(step),
            ok=step.kind != "invalid",
            malformed=step.kind == "invalid",
        )
    return traj


def _bad(where: str, problem: str) -> InvalidTrajectoryError:
    return InvalidTrajectoryError(f"{where}: {problem}")


def parse_step(call: subtask_pb2.ToolCall, where: str) -> ContextStep:
    """One tool call back into a :class:`ContextStep` (every field type-checked)."""
    if call.name not in _STEP_KINDS:
        raise _bad(f"{where}.name", f"{call.name!r} is not a context step ({sorted(_STEP_KINDS)})")
    try:
        args = json.loads(call.arguments_json or "{}")
    except ValueError as e:
        raise _bad(f"{where}.arguments_json", f"not JSON ({e})") from e
    if not isinstance(args, dict):
        raise _bad(f"{where}.arguments_json", "must be a JSON object")
    unknown = sorted(set(args) - {*_STR_ARGS, *_INT_ARGS, "read", "latency_s"})
    if unknown:
        raise _bad(f"{where}.arguments_json", f"unknown fields {unknown}")
    for key in _STR_ARGS:
        if not isinstance(args.get(key, ""), str):
            raise _bad(f"{where}.arguments_json.{key}", "must be a string")
    for key in _INT_ARGS:
        value = args.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _bad(f"{where}.arguments_json.{key}", f"must be an integer >= 0, got {value!r}")
    if not isinstance(args.get("read", False), bool):
        raise _bad(f"{where}.arguments_json.read", "must be a boolean")
    latency = args.get("latency_s", 0.0)
    if isinstance(latency, bool) or not isinstance(latency, int | float) or not latency >= 0:
        raise _bad(f"{where}.arguments_json.latency_s", f"must be a number >= 0, got {latency!r}")
    return ContextStep(call.name, **{**args, "latency_s": float(latency)})  # type: ignore[arg-type]


def parse_gold(text: str) -> tuple[GoldSpan, ...]:
    """The gold label back into spans (the question file's own validation, one place)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise _bad(f"labels[{LABEL_GOLD!r}]", f"not JSON ({e})") from e
    try:
        return parse_gold_spans(value, f"labels[{LABEL_GOLD!r}]", Path("<trajectory>"), 0)
    except QuestionFileError as e:
        raise InvalidTrajectoryError(str(e)) from e


def trajectory_episode(traj: trajectory_pb2.Trajectory) -> ContextEpisode:
    """A context trajectory back into its episode; :class:`InvalidTrajectoryError` (a
    ``ProcessingError``: the service dead-letters it) names the field of anything malformed."""
    if traj.env != CONTEXT_ENV:
        raise _bad("env", f"must be {CONTEXT_ENV!r}, got {traj.env!r}")
    for label in (LABEL_QUESTION, LABEL_BUDGET, LABEL_GOLD):
        if label not in traj.labels:
            raise _bad(f"labels[{label!r}]", "missing")
    budget = traj.labels[LABEL_BUDGET]
    if not budget.isdigit() or int(budget) < 1:
        raise _bad(f"labels[{LABEL_BUDGET!r}]", f"must be an integer >= 1, got {budget!r}")
    if len(traj.executions) != 1:
        raise _bad(
            "executions", f"a context trajectory has one execution, got {len(traj.executions)}"
        )
    ex = traj.executions[0]
    steps = tuple(
        parse_step(call, f"executions[0].tool_calls[{i}]") for i, call in enumerate(ex.tool_calls)
    )
    if not math.isfinite(traj.latency) or traj.latency < 0:
        raise _bad("latency", f"must be a finite number >= 0, got {traj.latency}")
    return ContextEpisode(
        question_id=traj.labels[LABEL_QUESTION],
        budget_tokens=int(budget),
        steps=steps,
        gold=parse_gold(traj.labels[LABEL_GOLD]),
        wall_s=traj.latency,
    )


def score_context_trajectory(
    traj: trajectory_pb2.Trajectory, config: ContextRewardConfig
) -> ContextReward:
    """The reward of a context trajectory, from its recorded evidence (what reward_svc runs
    for ``env == "context"``)."""
    return context_reward(trajectory_episode(traj), config)


CONTEXT_REWARD_CODE_VERSION = "1"
"""Version of this module's formulas; part of every context reward version."""


def context_reward_version(base: str, config: ContextRewardConfig) -> str:
    """``<base>+ctx<code>-<digest of config>``: a context score says which swarm reward config
    (the service's) and which context weights produced it, so a re-score can tell."""
    body = json.dumps(dataclasses.asdict(config), sort_keys=True)
    digest = hashlib.sha256(body.encode()).hexdigest()[:8]
    return f"{base}+ctx{CONTEXT_REWARD_CODE_VERSION}-{digest}"


def context_breakdown(
    traj: trajectory_pb2.Trajectory,
    base_version: str,
    progress: float,
    config: ContextRewardConfig | None = None,
) -> ScoreBreakdown:
    """A context trajectory's reward in the form every scorer returns (what
    :func:`podium.rewards.score.score` hands back for ``env == "context"``): components
    ``context.<part>``, the three context detectors as penalties, a penalty credit line each."""
    cfg = config or ContextRewardConfig()
    episode = trajectory_episode(traj)
    reward = context_reward(episode, cfg)
    weights = {
        "context.found": cfg.found,
        "context.precision": cfg.precision,
        "context.tokens": -cfg.tokens,
        "context.turns": -cfg.turn,
        "context.invalid": -cfg.invalid,
    }
    raw = {
        "context.found": float(episode.answer_found),
        "context.precision": episode.precision,
        "context.tokens": episode.tokens_kept / max(episode.budget_tokens, 1),
        "context.turns": float(len(episode.steps)),
        "context.invalid": float(episode.invalid),
    }
    credit = tuple(
        CreditEntry(kind="penalty", share=-f.penalty, reason=f"{f.name}: {f.detail}")
        for f in reward.findings
        if f.triggered
    )
    return ScoreBreakdown(
        total=reward.total,
        components={f"context.{k}": v for k, v in reward.components.items()},
        penalties=dict(reward.penalties),
        credit=credit,
        reward_version=context_reward_version(base_version, cfg),
        schedule_step=int(progress),
        raw=raw,
        weights=weights,
        findings=reward.findings,
        blame=None,
    )
