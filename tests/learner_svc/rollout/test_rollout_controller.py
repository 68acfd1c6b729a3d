"""The rollout controller end to end on a real bus (both implementations), with real twins.

Versions are rule engines ("rules:cpls", "rules:sequential"): valid candidates that make
sessions cheap. cpls beats sequential on every parallel task shape, so cpls against a
sequential live version is a good candidate, and sequential against a cpls live version a
sabotaged one (it serialises everything).

The controller's statistics store of the sub-agents: fed once per scored trajectory, it
survives a crash between feeding and committing (nothing lost, nothing counted twice), and
after a drift its twins judge cpls-online (which plans on the store) against cpls on the
sub-agents as observed — a comparison twins on the advertised pool cannot make.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kafka_helpers import kafka_test_config
from rollout_helpers import (
    K,
    Traffic,
    app,
    kinds,
    overriding,
    pausing,
    proposing,
    resuming,
    settings,
    until,
)

from learner_svc.rollout.controller import RolloutController
from learner_svc.rollout.evidence import load_registry, stats_from_checkpoint
from podium.bus import Bus, KafkaBus, read_committed
from podium.bus.base import TopicSpec
from podium.envs.swarm.drift import load_drift
from podium.envs.swarm.spec import default_pool
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.v1 import reward_pb2, rollout_pb2

STAGED = rollout_pb2.ROLLOUT_STAGE_STAGED
IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE
OFFLINE = rollout_pb2.ROLLOUT_STAGE_OFFLINE_CHECK


async def drive(
    traffic: Traffic,
    controller: RolloutController,
    done: Callable[[], bool],
    *,
    batch: int = 50,
    max_sessions: int = 4000,
) -> int:
    """Publish sessions routed by the controller's current state until ``done()``; returns
    how many were sent."""
    sent = 0
    while not done():
        assert sent < max_sessions, f"not done after {sent} sessions"
        target = controller.stats.absorbed + batch
        await traffic.publish(controller.state, batch)
        sent += batch

        def absorbed(t: int = target) -> bool:
            return controller.stats.absorbed >= t or done()

        await until(absorbed, what="sessions absorbed")
    return sent


async def test_good_candidate_walks_offline_shadow_and_every_stage(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    s = settings(unique, cold_start="rules:sequential")
    traffic = Traffic(bus, s)
    a = app(s, bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        await traffic.publish(c.state, 12)  # recorded live sessions for the offline check
        await until(lambda: c.stats.absorbed >= 12)
        await c.command("propose", proposing("rules:cpls"))
        await drive(traffic, c, lambda: c.state.live_version == "rules:cpls")
        walked = list(c.registry.transitions)
    finally:
        await a.stop()
    assert kinds(walked) == [
        K.TRANSITION_KIND_WRITER_CLAIMED,
        K.TRANSITION_KIND_CANDIDATE_PROPOSED,
        K.TRANSITION_KIND_OFFLINE_PASSED,
        K.TRANSITION_KIND_SHADOW_PASSED,
        K.TRANSITION_KIND_STAGE_ADVANCED,
        K.TRANSITION_KIND_STAGE_ADVANCED,
        K.TRANSITION_KIND_STAGE_ADVANCED,
        K.TRANSITION_KIND_PROMOTED,
    ]
    assert [t.state.canary_percent for t in walked] == [0, 0, 0, 1, 5, 20, 100, 0]
    offline, shadow = walked[2].evidence, walked[3].evidence
    assert offline.figures["sessions"] == 10 and offline.figures["paired_mean"] > 0
    assert shadow.figures["window"] == 20 and shadow.figures["lower_bound"] > 0
    for t in walked[4:]:
        assert t.evidence.figures["stage_sessions"] >= 5
        assert {g.name for g in t.evidence.guardrails} >= {"incomplete", "latency_ratio"}
        assert not any(g.breached for g in t.evidence.guardrails)
    final = walked[-1].state
    assert (final.live_version, final.previous_version, final.stage) == (
        "rules:cpls",
        "rules:sequential",
        IDLE,
    )
    assert final.cycle == 2
    # What the registry holds is what was walked: each transition once, seqs in order.
    registry = load_registry(await read_committed(bus, s.topic))
    assert [t.seq for t in registry.transitions] == [t.seq for t in walked]
    assert registry.state is not None and registry.state.seq == final.seq
    assert a.controller.evidence.review_queue, "canary sessions at 20% were sampled for review"


async def test_sabotaged_candidate_stops_in_shadow(bus: Bus, unique: Callable[[str], str]) -> None:
    # Tolerant offline check: the point is that shadow stops it (the offline check would too).
    s = settings(unique, offline_tolerance=1e9)
    traffic = Traffic(bus, s)
    a = app(s, bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        await c.command("propose", proposing("rules:sequential"))
        await drive(traffic, c, lambda: c.state.stage == IDLE and c.state.seq > 2)
        walked = list(c.registry.transitions)
    finally:
        await a.stop()
    assert kinds(walked)[-3:] == [
        K.TRANSITION_KIND_CANDIDATE_PROPOSED,
        K.TRANSITION_KIND_OFFLINE_PASSED,
        K.TRANSITION_KIND_SHADOW_FAILED,
    ]
    failed = walked[-1]
    assert failed.evidence.figures["mean"] < 0
    assert failed.state.live_version == "rules:cpls" and not failed.state.candidate_version
    assert all(t.state.stage != STAGED for t in walked), "never served a user"


async def test_guardrail_breach_rolls_back_with_its_reading(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    # An operator forces a serialising candidate past shadow into 20% of traffic: its
    # latency against the baseline arm breaches, and the controller rolls back by itself.
    s = settings(unique, stage_min_sessions=10_000)
    traffic = Traffic(bus, s)
    a = app(s, bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        # Paused: only the operator moves it forward; a guardrail still rolls back.
        await c.command("pause", pausing)
        await c.command("propose", proposing("rules:sequential"))
        for _ in range(4):  # offline -> shadow -> 1% -> 5% -> 20%
            await c.command("promote", overriding)
        assert (c.state.stage, c.state.canary_percent, c.state.paused) == (STAGED, 20, True)
        sent = await drive(traffic, c, lambda: c.state.stage == IDLE, batch=20)
        walked = list(c.registry.transitions)
    finally:
        await a.stop()
    back = walked[-1]
    assert back.kind == K.TRANSITION_KIND_ROLLED_BACK and back.actor == "controller"
    breached = [g for g in back.evidence.guardrails if g.breached]
    assert breached and "latency_ratio" in {g.name for g in breached}
    reading = next(g for g in breached if g.name == "latency_ratio")
    assert reading.canary_mean > reading.baseline_mean
    assert reading.statistic >= reading.threshold
    assert "latency_ratio" in back.reason
    assert back.state.live_version == "rules:cpls" and back.state.stage == IDLE
    assert sent <= 400, f"took {sent} sessions to roll back"


async def test_restart_resumes_mid_stage_from_the_checkpoint(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    s = settings(unique, cold_start="rules:sequential", stage_min_sessions=40)
    traffic = Traffic(bus, s)
    first = app(s, bus, "first")
    await first.start()
    try:
        c = first.controller
        await until(lambda: c.writer, what="the writer role")
        await c.command("pause", pausing)
        await c.command("propose", proposing("rules:cpls"))
        for _ in range(4):
            await c.command("promote", overriding)
        await c.command("resume", resuming)
        target = c.stats.absorbed + 60
        await traffic.publish(c.state, 60)
        await until(lambda: c.stats.absorbed >= target)
        before = c.status()
        assert sum(before.arm_sessions.values()) == 60
        assert 0 < before.evidence.figures["stage_sessions"] < 40
    finally:
        await first.stop()
    second = app(s, bus, "second")
    await second.start()
    try:
        c2 = second.controller
        await until(lambda: c2.writer, what="the writer role again")
        after = c2.status()
        assert after.state.canary_percent == 20
        assert after.state.writer_epoch == before.state.writer_epoch + 1
        assert after.evidence.figures["stage_sessions"] == before.evidence.figures["stage_sessions"]
        assert dict(after.arm_sessions) == dict(before.arm_sessions)
        assert [(g.name, g.canary_n, g.baseline_n) for g in after.evidence.guardrails] == [
            (g.name, g.canary_n, g.baseline_n) for g in before.evidence.guardrails
        ]
        assert c2.stats.absorbed == 0, "nothing counted again"
        await drive(traffic, c2, lambda: c2.state.live_version == "rules:cpls")
        await traffic.publish(c2.state, 20)  # after promotion: nothing more may happen
    finally:
        await second.stop()
    registry = load_registry(await read_committed(bus, s.topic))
    promoted = [t for t in registry.transitions if t.kind == K.TRANSITION_KIND_PROMOTED]
    assert len(promoted) == 1
    assert registry.state is not None and registry.state.live_version == "rules:cpls"


@pytest.mark.parametrize("bad", [b"not an envelope", None])
async def test_undecodable_input_is_skipped_and_committed(
    inproc_bus: Bus, unique: Callable[[str], str], bad: bytes | None
) -> None:
    s = settings(unique)
    a = app(s, inproc_bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        await inproc_bus.publish(s.in_topic, bad or b"", key="x")
        await until(lambda: c.stats.undecodable == 1)
        await Traffic(inproc_bus, s).publish(c.state, 3)
        await until(lambda: c.stats.absorbed == 3)
    finally:
        await a.stop()


@pytest.mark.kafka
async def test_a_registry_topic_with_several_partitions_is_refused(
    kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    """Made by someone else with three partitions, the registry would lose its one order:
    the controller refuses to start, naming the setting and the remedy."""
    s = settings(unique)
    kafka = KafkaBus(kafka_test_config(kafka_bootstrap))
    await kafka.start()
    try:
        await kafka.create_topics([TopicSpec(s.topic, 3)])
        a = app(s, kafka)
        with pytest.raises(ConfigError, match=r"exactly one partition \(it has 3\)"):
            await a.start()
        await a.stop()
    finally:
        await kafka.stop()


# --------------------------------------------------------------------------- the statistics store

SHADOW = rollout_pb2.ROLLOUT_STAGE_SHADOW


def drifted_traffic(bus: Bus, s: Any) -> Traffic:
    """Sessions on the sub-agents after the ``slow-specialist`` drift (backend runs api at a
    fifth of its advertised speed) while the pool spec everyone reads stays nominal."""
    nominal = default_pool()
    return Traffic(bus, s, true_pool=load_drift("slow-specialist").pool_at(nominal, 3600))


def reference(scored: list[reward_pb2.ScoredTrajectory], half_life: float) -> AgentStats:
    """The store that counts each session exactly once."""
    store = AgentStats(half_life=half_life)
    for sc in scored:
        store.record_trajectory(sc.trajectory)
    return store


def same_sums(got: AgentStats, want: AgentStats) -> None:
    """Same pairs, same decayed sums (up to the order executions were recorded in)."""
    rows = {(r["agent"], r["kind"]): r for r in got.to_dict()["pairs"]}
    wanted = {(r["agent"], r["kind"]): r for r in want.to_dict()["pairs"]}
    assert rows.keys() == wanted.keys()
    for key, row in wanted.items():
        for name in ("n", "successes", "pace"):
            assert rows[key][name] == pytest.approx(row[name], rel=1e-6), (key, name)


class Killed(Exception):
    """The controller process dies here (no handler of the controller's catches it)."""


def die_at_next_commit(c: RolloutController) -> asyncio.Event:
    """The controller's next transaction dies after its records are published and before its
    commit (the store copy already fed): set once it did."""
    died = asyncio.Event()
    begin = c.member.begin

    async def dying_begin(tp: Any) -> Any:
        txn = await begin(tp)

        async def commit(_records: Any) -> None:
            died.set()
            raise Killed("kill -9 between feeding the store and committing")

        txn.commit = commit  # type: ignore[method-assign]
        return txn

    c.member.begin = dying_begin  # type: ignore[method-assign]
    return died


async def test_the_store_survives_a_crash_without_losing_or_double_counting(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    # A half-life far beyond the test's executions: the sums do not depend on the order the
    # partitions' batches were absorbed in, so they must equal counting each session once.
    half_life = 1e9
    s = settings(unique, agent_stats_half_life=half_life)
    traffic = drifted_traffic(bus, s)
    first = app(s, bus, "first")
    await first.start()
    sent: list[reward_pb2.ScoredTrajectory] = []
    try:
        c = first.controller
        await until(lambda: c.writer, what="the writer role")
        sent += await traffic.publish(c.state, 40)
        await until(lambda: c.stats.absorbed >= 40, what="40 sessions absorbed")
        assert c.evidence.stats is not None
        committed = c.evidence.stats.to_dict()
        assert c.stats.executions == reference(sent, half_life).version > 0
        died = die_at_next_commit(c)
        sent += await traffic.publish(c.state, 30)
        await asyncio.wait_for(died.wait(), 30)
        writer = next(t for t in first.shell.tasks if t.get_name().endswith(f".{s.group_id}"))
        await until(writer.done, what="the writer's death")
        assert c.evidence.stats.to_dict() == committed, "nothing of the dead batch adopted"
    finally:
        await first.stop()
    assert isinstance(writer.exception(), Killed)
    # What the registry holds is the store as of the last commit: the 40 sessions.
    cp = load_registry(await read_committed(bus, s.topic)).checkpoint
    assert cp is not None
    restored = stats_from_checkpoint(cp, AgentStats(half_life=half_life))
    assert restored is not None and restored.to_dict() == committed
    second = app(s, bus, "second")
    await second.start()
    try:
        c2 = second.controller
        await until(lambda: c2.writer, what="the writer role again")
        sent += await traffic.publish(c2.state, 30)
        await until(lambda: c2.stats.absorbed >= 60, what="the dead batch and 30 more")
        await asyncio.sleep(0.3)
        assert c2.stats.absorbed == 60 and c2.stats.unrecorded == 0
        status = c2.status()
    finally:
        await second.stop()
    store = c2.evidence.stats
    want = reference(sent, half_life)
    assert store is not None and store.version == want.version  # every execution, once
    assert status.evidence.figures["agent_stats_executions"] == want.version
    same_sums(store, want)
    api = store.estimate("backend", "api", default_pool().agents[1].profile("api"))
    assert api is not None and api.speed < 0.35  # the drift, observed


@pytest.mark.parametrize("observed", [True, False], ids=["store", "no-store"])
async def test_after_a_drift_shadow_judges_on_the_observed_sub_agents(
    inproc_bus: Bus, unique: Callable[[str], str], observed: bool
) -> None:
    """cpls-online against a live cpls after the drift: twins on the store's estimated pool
    see backend's slow api work and cpls-online routing around it, so it passes shadow; with
    the store off, twins run the advertised pool, where the two are the same engine, and it
    cannot pass (every difference is zero: shadow gives up at its limit). Twins read the store
    as absorbed when they run, so how many comparisons a pass takes varies with timing (20 to
    60 seen): the store's arm gets room to pass, the other arm a short limit to fail at."""
    limit = 200 if observed else 60
    s = settings(unique, agent_stats=observed, offline_tolerance=1e9, shadow_max_sessions=limit)
    traffic = drifted_traffic(inproc_bus, s)
    a = app(s, inproc_bus)
    await a.start()
    try:
        c = a.controller
        await until(lambda: c.writer, what="the writer role")
        await traffic.publish(c.state, 40)  # the store observes the drift (while IDLE)
        await until(lambda: c.stats.absorbed >= 40)
        await c.command("propose", proposing("rules:cpls-online"))
        await drive(traffic, c, lambda: c.state.stage not in (SHADOW, OFFLINE), batch=20)
        walked = list(c.registry.transitions)
    finally:
        await a.stop()
    verdict = walked[-1]
    offline = next(t for t in walked if t.kind == K.TRANSITION_KIND_OFFLINE_PASSED)
    if observed:
        assert verdict.kind == K.TRANSITION_KIND_SHADOW_PASSED
        assert verdict.evidence.figures["mean"] > 0
        assert offline.evidence.figures["paired_mean"] > 0
    else:
        assert verdict.kind == K.TRANSITION_KIND_SHADOW_FAILED
        assert verdict.evidence.figures["mean"] == 0.0
        assert offline.evidence.figures["paired_mean"] == 0.0
