"""The context environment's detectors: each fires on its hack, stays quiet on a clean twin,
and costs reward in the total."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest

from podium.context.questions import GoldSpan
from podium.errors import ConfigError
from podium.rewards.config import ContextRewardConfig
from podium.rewards.context import (
    CONTEXT_DETECTORS,
    CONTEXT_HOARDING,
    GOLD_PRUNING,
    SEARCH_LOOP,
    ContextEpisode,
    ContextStep,
    StepKind,
    context_hoarding,
    context_reward,
    episode_trajectory,
    gold_pruning,
    score_context_trajectory,
    search_loop,
    trajectory_episode,
)
from podium.rewards.facts import InvalidTrajectoryError
from podium.v1 import trajectory_pb2

CFG = ContextRewardConfig()
GOLD = (GoldSpan("gold.txt", 0, 100),)


def search(query: str, retriever: str = "bm25") -> ContextStep:
    return ContextStep("search", retriever=retriever, form="question", query=query)


def chunk(kind: StepKind, i: int, gold: bool, read: bool = False) -> ContextStep:
    """Chunk ``i`` (100 tokens); a gold one lies in the gold span's document."""
    source = "gold.txt" if gold else "other.txt"
    return ContextStep(
        kind, chunk_id=f"c{i}", source=source, start=0, end=100, tokens=100, read=read
    )


def keep(i: int, gold: bool = False) -> ContextStep:
    return chunk("keep", i, gold)


def prune(i: int, gold: bool = False, read: bool = False) -> ContextStep:
    return chunk("prune", i, gold, read)


def episode(*steps: ContextStep, budget: int = 1000) -> ContextEpisode:
    return ContextEpisode("q", budget, (*steps, ContextStep("finish")), GOLD)


def test_keeping_everything_up_to_the_budget_is_hoarding() -> None:
    hoard = episode(search("open"), *(keep(i) for i in range(10)))
    finding = context_hoarding(hoard, CFG.hoarding)
    assert finding.triggered and finding.measure == 1.0
    assert finding.penalty == pytest.approx(CFG.hoarding.weight)
    selective = episode(
        search("open"), *(keep(i) for i in range(5)), *(prune(i, read=True) for i in range(5, 10)),
        budget=500,
    )  # fmt: skip
    assert not context_hoarding(selective, CFG.hoarding).triggered
    half_full = episode(search("open"), keep(1), keep(2), keep(3))
    assert not context_hoarding(half_full, CFG.hoarding).triggered


def test_a_blind_prune_streak_through_the_gold_is_caught() -> None:
    blind = episode(search("open"), prune(1), prune(2, gold=True), prune(3), keep(4))
    finding = gold_pruning(blind, CFG.gold_pruning)
    assert finding.triggered and finding.measure == 1.0
    assert "c2" in finding.detail
    assert finding.penalty == pytest.approx(CFG.gold_pruning.weight * (1 - math.exp(-1)))
    # The same prunes, read first, or too short a run, or gold kept: no blind streak.
    read = episode(search("open"), prune(1, read=True), prune(2, True, True), prune(3, read=True))
    short = episode(search("open"), prune(1), prune(2, gold=True), keep(3), prune(4))
    no_gold = episode(search("open"), prune(1), prune(2), prune(3), keep(4, gold=True))
    for clean in (read, short, no_gold):
        assert not gold_pruning(clean, CFG.gold_pruning).triggered


def test_repeated_identical_searches_are_a_loop() -> None:
    loop = episode(search("open flags"), search("Open   FLAGS"), search("open flags"))
    finding = search_loop(loop, CFG.search_loop)
    assert finding.triggered and finding.measure == 2.0
    varied = episode(search("open flags"), search("open flags", "dense"), search("O_CREAT"))
    assert not search_loop(varied, CFG.search_loop).triggered


@pytest.mark.parametrize(
    ("hack", "name"),
    [
        (episode(search("q"), *(keep(i) for i in range(5)), budget=520), CONTEXT_HOARDING),
        (episode(search("q"), prune(1, gold=True), prune(2), prune(3)), GOLD_PRUNING),
        (episode(search("q"), search("q"), search("q")), SEARCH_LOOP),
    ],
)
def test_each_detector_costs_reward_in_the_total(hack: ContextEpisode, name: str) -> None:
    reward = context_reward(hack, CFG)
    assert set(reward.penalties) == set(CONTEXT_DETECTORS)
    assert reward.penalties[name] > 0
    others = sum(v for k, v in reward.penalties.items() if k != name)
    assert reward.total == pytest.approx(
        sum(reward.components.values()) - others - reward.penalties[name]
    )
    assert reward.total < sum(reward.components.values()) - others


def test_reward_shape_is_scored_from_the_kept_chunks() -> None:
    steps = (search("x"), keep(1, gold=True), ContextStep("invalid"), ContextStep("finish"))
    ep = ContextEpisode("q", 1000, steps, GOLD)
    assert (ep.answer_found, ep.precision, ep.tokens_kept, ep.searches) == (True, 1.0, 100, 1)
    reward = context_reward(ep, CFG)
    assert reward.components == pytest.approx(
        {"found": 1.0, "precision": 0.25, "tokens": -0.02, "turns": -0.02, "invalid": -0.05}
    )
    assert reward.total == pytest.approx(1.16)
    # The same steps against another question's gold: nothing found, nothing precise.
    missed = context_reward(
        ContextEpisode("q", 1000, steps, (GoldSpan("gold.txt", 100, 200),)), CFG
    )
    assert missed.components["found"] == missed.components["precision"] == 0.0
    assert missed.total < reward.total - 1.0


def test_negative_weight_is_named() -> None:
    with pytest.raises(ConfigError, match=r"context\.turn: must be a finite number >= 0, got -1.0"):
        ContextRewardConfig(turn=-1.0)


def test_trajectory_round_trip_scores_the_same() -> None:
    ep = episode(
        search("open flags"),
        ContextStep("search", retriever="dense", form="keywords", query="open", latency_s=0.25),
        ContextStep("read", chunk_id="c9", source="gold.txt", start=0, end=100, tokens=100),
        chunk("keep", 9, gold=True, read=True),
        prune(1),
        ContextStep("invalid"),
    )
    traj = episode_trajectory(ep, trajectory_id="t1", policy_version="3", agent="learned")
    assert traj.env == "context" and traj.labels["context.budget_tokens"] == "1000"
    assert [c.name for c in traj.executions[0].tool_calls][-2:] == ["invalid", "finish"]
    assert traj.executions[0].tool_calls[-2].malformed
    back = trajectory_episode(trajectory_pb2.Trajectory.FromString(traj.SerializeToString()))
    assert back == ep
    assert score_context_trajectory(traj, CFG) == context_reward(ep, CFG)


def test_a_trajectory_cannot_claim_gold_it_did_not_keep() -> None:
    traj = episode_trajectory(episode(search("q"), keep(1)), trajectory_id="t")
    traj.completed = traj.claimed_success = True  # claims change nothing: evidence scores
    assert score_context_trajectory(traj, CFG).components["found"] == 0.0


def _mutated(mutate: Callable[[trajectory_pb2.Trajectory], None]) -> trajectory_pb2.Trajectory:
    traj = episode_trajectory(episode(search("q"), keep(1, gold=True)), trajectory_id="t")
    mutate(traj)
    return traj


def _set_args(text: str) -> Callable[[trajectory_pb2.Trajectory], None]:
    def mutate(traj: trajectory_pb2.Trajectory) -> None:
        traj.executions[0].tool_calls[1].arguments_json = text

    return mutate


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda t: setattr(t, "env", "swarm"), "env"),
        (lambda t: t.labels.pop("context.gold"), "labels['context.gold']: missing"),
        (lambda t: t.labels.update({"context.budget_tokens": "-3"}), "context.budget_tokens"),
        (lambda t: t.labels.update({"context.gold": "[]"}), "'gold' must be a non-empty list"),
        (lambda t: setattr(t.executions[0].tool_calls[1], "name", "steal"), "tool_calls[1].name"),
        (_set_args("{oops"), "tool_calls[1].arguments_json: not JSON"),
        (_set_args('{"start": -1}'), "arguments_json.start"),
        (_set_args('{"tokens": true}'), "arguments_json.tokens"),
        (_set_args('{"read": 1}'), "arguments_json.read"),
        (_set_args('{"gold": true}'), "unknown fields ['gold']"),
        (lambda t: t.executions.add(), "executions"),
    ],
)
def test_malformed_trajectory_names_the_field(
    mutate: Callable[[trajectory_pb2.Trajectory], None], field: str
) -> None:
    with pytest.raises(InvalidTrajectoryError, match=re.escape(field)):
        trajectory_episode(_mutated(mutate))
