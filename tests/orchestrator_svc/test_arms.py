"""Rollout arms in the orchestrator (issue 13): every replica applies the rollout state and
routes each session to its arm; no learned version goes live merely because it loaded.

* two followers of one rollout topic agree on the arm of 10,000 session ids, a state change
  reaches both with its propagation delay measured, and a stale-epoch or lower-seq state (or an
  unreadable record) is ignored — on both buses (real Kafka included);
* an orchestrator with signed learned versions: a loaded version serves nobody until a state
  routes to it; the trajectory records its arm (``Trajectory.arm``, ``labels["arm"]``) and each
  decision's ``decide_ms``; the state written before start-up routes the very first session;
  on a rollback, sessions in flight finish on the version they started with and new sessions
  go to the previous one at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import pytest
import torch
from signing_helpers import key_pair, signed, trusted

from orchestrator_svc import OrchestratorApp, OrchestratorConfig
from orchestrator_svc.arms import RolloutFollower, effective_route, parse_state, supersedes
from orchestrator_svc.learned import LearnedPolicySource
from podium import topics
from podium.bus import Bus, InProcBus
from podium.bus.base import Record, TopicSpec
from podium.bus.consumer import EventPublisher, encode_record
from podium.envs.swarm import EnvConfig, SwarmEnv, TaskSpec, default_pool
from podium.envs.swarm.generator import generate_suite
from podium.envs.swarm.trajectory import task_to_proto
from podium.errors import ProcessingError
from podium.policy.agent import SwarmAgent
from podium.policy.artifacts import ArtifactRef
from podium.policy.holder import Served
from podium.policy.signing import KeyPair
from podium.policy.swarm import MODEL_NAME, save_policy, swarm_policy_updated
from podium.rollout.routing import Route, bucket
from podium.v1 import rollout_pb2, task_pb2, trajectory_pb2
from subagent_svc import SubagentApp, SubagentConfig

IDLE = rollout_pb2.ROLLOUT_STAGE_IDLE
STAGED = rollout_pb2.ROLLOUT_STAGE_STAGED
LIVE = trajectory_pb2.ARM_ROLE_LIVE
CANARY = trajectory_pb2.ARM_ROLE_CANARY
BASELINE = trajectory_pb2.ARM_ROLE_BASELINE
COMPACT = (("cleanup.policy", "compact"),)


def state(
    seq: int,
    *,
    epoch: int = 1,
    live: str = "rules:cpls",
    previous: str = "",
    candidate: str = "",
    percent: int = 0,
    baseline_bp: int = 500,
) -> rollout_pb2.RolloutState:
    """A rollout state as the controller writes it (STAGED when ``percent`` > 0), changed now."""
    st = rollout_pb2.RolloutState(
        seq=seq,
        writer_epoch=epoch,
        live_version=live,
        previous_version=previous,
        candidate_version=candidate,
        stage=STAGED if percent else IDLE,
        canary_percent=percent,
        baseline_bp=baseline_bp,
        writer="test-controller",
        reason=f"test state {seq}",
    )
    st.changed_at.GetCurrentTime()
    return st


async def publish_state(bus: Bus, topic: str, st: rollout_pb2.RolloutState) -> None:
    """Write ``st`` under the state key, as the controller does."""
    await EventPublisher(bus, producer_name="test").publish(topic, st, key="state")


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def session_ids(n: int, *, seed: str = "arms") -> list[str]:
    """``n`` session ids as the orchestrator makes them (uuid5 of a client request id)."""
    ns = uuid.uuid5(uuid.NAMESPACE_URL, seed)
    return [str(uuid.uuid5(ns, str(i))) for i in range(n)]


# ------------------------------------------------------------------------- pure rules


def test_supersedes_needs_a_higher_seq_and_no_older_epoch() -> None:
    applied = state(5, epoch=2)
    assert supersedes(state(6, epoch=2), applied, 2)
    assert supersedes(state(6, epoch=3), applied, 2)
    assert not supersedes(state(5, epoch=2), applied, 2)  # a replay
    assert not supersedes(state(4, epoch=3), applied, 2)  # an older seq, whatever its epoch
    assert not supersedes(state(9, epoch=1), applied, 2)  # a fenced writer's late state
    assert supersedes(state(1), None, 0)


def test_parse_state_skips_other_keys_tombstones_and_junk(caplog: pytest.LogCaptureFixture) -> None:
    published = state(3)
    envelope_bytes = _encoded(published)
    assert parse_state(_record(b"state", envelope_bytes)) == published
    assert parse_state(_record(b"transition:000000000003", envelope_bytes)) is None
    assert parse_state(_record(b"checkpoint", envelope_bytes)) is None
    assert parse_state(_record(b"state", None)) is None
    assert parse_state(_record(b"state", b"\x00not an envelope")) is None
    assert "unreadable" in caplog.text


def _encoded(st: rollout_pb2.RolloutState) -> bytes:
    """``st`` as the bytes a record carries (a codec envelope)."""
    _, value, _ = encode_record(st, producer="t", key="state")
    return value


def _record(key: bytes, value: bytes | None) -> Record:
    return Record(topics.ROLLOUT, 0, 0, key, value)


def test_a_route_to_a_version_not_loaded_falls_back_to_live_else_cold_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    canary = Route("9", CANARY, 777, 4)
    loaded = {"1", "rules:cpls"}.__contains__
    assert effective_route(canary, "1", loaded, "rules:cpls") == Route("1", LIVE, 777, 4)
    assert "not loaded here" in caplog.text
    assert effective_route(canary, "3", loaded, "rules:cpls") == Route("rules:cpls", LIVE, 777, 4)
    assert effective_route(Route("1", BASELINE, 3, 4), "9", loaded, "rules:cpls").role == BASELINE


# ------------------------------------------------------------------------- followers


async def test_two_followers_agree_on_every_arm_and_follow_changes(
    bus: Bus, unique: Callable[[str], str]
) -> None:
    topic = unique("rollout")
    await bus.create_topics([TopicSpec(topic, 1, config=COMPACT)])
    await publish_state(bus, topic, state(1))
    await publish_state(bus, topic, state(2, live="3", previous="2", candidate="7", percent=20))
    applied: dict[str, list[int]] = {"a": [], "b": []}
    followers = {
        name: RolloutFollower(
            bus,
            unique(f"orch.rollout.{name}"),
            topic=topic,
            on_state=lambda st, n=name: applied[n].append(st.seq),  # type: ignore[misc]
        )
        for name in applied
    }
    for f in followers.values():
        await f.start()  # returns caught up: the state written before it is applied
        assert f.caught_up() and f.state is not None and f.state.seq == 2
    a, b = followers["a"], followers["b"]
    tasks = [asyncio.create_task(f.run()) for f in (a, b)]
    try:
        ids = session_ids(10_000)
        routes_a = [a.route(sid) for sid in ids]
        assert routes_a == [b.route(sid) for sid in ids]
        shares = Counter(r.role for r in routes_a)
        # 5% baseline (previous version), 20% canary, the rest live; within 1.5 points.
        assert abs(shares[BASELINE] / 10_000 - 0.05) < 0.015
        assert abs(shares[CANARY] / 10_000 - 0.20) < 0.015
        assert {r.version for r in routes_a if r.role == BASELINE} == {"2"}
        assert {r.version for r in routes_a if r.role == CANARY} == {"7"}
        assert {r.version for r in routes_a if r.role == LIVE} == {"3"}

        # A rollback (a new writer generation) reaches both; its delay is measured.
        await publish_state(bus, topic, state(3, epoch=2, live="3", previous="2"))
        await wait_for(lambda: a.state.seq == b.state.seq == 3, "the rollback on both")  # type: ignore[union-attr]
        for f in (a, b):
            # Only live changes count (not the catch-up's states, which may be old).
            assert len(f.propagation_ms) == 1 and 0 <= f.propagation_ms[0] < 10_000
        routes = [a.route(sid) for sid in ids]
        assert routes == [b.route(sid) for sid in ids]
        assert all(r.role != CANARY and r.seq == 3 for r in routes)

        # A fenced writer's late state (older epoch, higher seq), a replayed older state and
        # junk are ignored; the next real state is applied.
        await publish_state(bus, topic, state(9, epoch=1, live="66"))
        await publish_state(bus, topic, state(2, epoch=2, live="55"))
        await bus.publish(topic, b"junk", key="state")
        await publish_state(bus, topic, state(4, epoch=2, live="4", previous="3"))
        await wait_for(lambda: a.state.seq == b.state.seq == 4, "the next real state")  # type: ignore[union-attr]
        assert applied == {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4]}
        assert a.state is not None and a.state.live_version == "4" and a.epoch == 2
    finally:
        for f in (a, b):
            await f.stop(5.0)
        await asyncio.gather(*tasks)


# ------------------------------------------------------------------------- the orchestrator


@pytest.fixture
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return key_pair(tmp_path_factory.mktemp("keys"))


def tasks() -> list[TaskSpec]:
    return generate_suite(4, seed=11, sizes=(4, 8))


def publish_version(root: Path, version: int) -> ArtifactRef:
    env = SwarmEnv(tasks(), default_pool(), EnvConfig(max_subtasks=64))
    torch.manual_seed(version)
    agent = SwarmAgent(env.layout)
    return save_policy(agent.net, root, version, tuple(env.layout.agents), max_subtasks="64")


async def announce(bus: InProcBus, root: Path, version: int, keys: KeyPair) -> None:
    """The learner's signed announcement of a fresh version ``version``."""
    event = signed(swarm_policy_updated(publish_version(root, version)), keys)
    await EventPublisher(bus, producer_name="test").publish(
        topics.POLICY_UPDATES, event, key=MODEL_NAME
    )


def learned_config(keys: KeyPair, group: str) -> OrchestratorConfig:
    return OrchestratorConfig(
        bus_url="embedded",
        group_id=group,
        policy="learned",
        policy_trusted_keys=str(keys.public_path),
        rollout_topic=f"{group}.rollout",
        session_timeout_s=20.0,
        shutdown_timeout_s=5.0,
    )


@pytest.fixture
async def stack(keys: KeyPair) -> AsyncIterator[tuple[InProcBus, OrchestratorApp]]:
    """A controlled learned orchestrator and a slow sub-agent worker (sessions last ~0.5 s,
    so a state change can land while some are in flight)."""
    bus = InProcBus()
    await bus.start()
    orch = OrchestratorApp(learned_config(keys, "arms.orchestrator"), bus, serve_grpc=False)
    worker = SubagentApp(
        SubagentConfig(
            bus_url="embedded", group_id="arms.subagent", time_scale=0.02, shutdown_timeout_s=5.0
        ),
        bus,
    )
    await worker.start()
    await orch.start()
    try:
        yield bus, orch
    finally:
        await orch.stop()
        await worker.stop()
        await bus.stop()


async def submit(bus: InProcBus, sid: str, task: TaskSpec, seed: int = 3) -> None:
    await EventPublisher(bus, producer_name="test").publish(
        topics.TASKS,
        task_pb2.TaskSubmitted(
            session_id=sid, task=task_to_proto(task), submitted_by="grpc:ide", seed=seed
        ),
        key=sid,
    )


async def finished(orch: OrchestratorApp, sids: Iterable[str]) -> list[trajectory_pb2.Trajectory]:
    out = []
    for sid in sids:
        await wait_for(
            lambda s=sid: (h := orch.session(s)) is not None and h.trajectory is not None,  # type: ignore[misc]
            f"session {sid}",
            timeout_s=60.0,
        )
        handle = orch.session(sid)
        assert handle is not None and handle.trajectory is not None
        out.append(handle.trajectory)
    return out


def outside_baseline(n: int, seed: str, baseline_bp: int = 500) -> list[str]:
    """``n`` session ids whose bucket is outside the baseline range (live or canary)."""
    return [s for s in session_ids(20 * n + 100, seed=seed) if bucket(s) >= baseline_bp][:n]


async def test_a_loaded_version_serves_nobody_until_a_state_routes_to_it(
    stack: tuple[InProcBus, OrchestratorApp], keys: KeyPair, tmp_path: Path
) -> None:
    bus, orch = stack
    assert orch.learned is not None and orch.rollout is not None
    await announce(bus, tmp_path, 1, keys)
    await wait_for(lambda: 1 in orch.learned.loaded, "v1 loaded")  # type: ignore[union-attr]
    first, second, base = (
        outside_baseline(2, "loaded")
        + [s for s in session_ids(2000, seed="base") if bucket(s) < 500][:1]
    )
    await submit(bus, first, tasks()[0])
    (cold,) = await finished(orch, [first])
    # Loaded, verified and the newest: still not live, the rollout has not routed to it.
    assert cold.policy_version == "rules:cpls"
    assert cold.arm == Route("rules:cpls", LIVE, bucket(first), 0).arm()
    assert cold.labels["arm"] == "live:rules:cpls"
    assert cold.decisions and all(d.decide_ms > 0 for d in cold.decisions)

    await publish_state(bus, orch.config.rollout_topic, state(1, live="1", previous="rules:cpls"))
    await wait_for(lambda: orch.rollout.state is not None, "the state applied")  # type: ignore[union-attr]
    await submit(bus, second, tasks()[0])
    await submit(bus, base, tasks()[0])
    live, baseline = await finished(orch, [second, base])
    assert live.policy_version == "1" and {d.policy_version for d in live.decisions} == {"1"}
    assert live.arm == trajectory_pb2.Arm(
        policy_version="1", role=LIVE, rollout_seq=1, bucket=bucket(second)
    )
    assert live.labels["arm"] == "live:1"
    assert all(d.decide_ms > 0 for d in live.decisions)
    # The baseline share stays on the previous live version (here the cold-start rules).
    assert (
        baseline.policy_version == "rules:cpls" and baseline.labels["arm"] == "baseline:rules:cpls"
    )
    assert orch.rollout.propagation_ms and orch.learned.pinned == frozenset({1})


async def test_rollback_sessions_in_flight_finish_on_their_version_new_ones_go_back(
    stack: tuple[InProcBus, OrchestratorApp], keys: KeyPair, tmp_path: Path
) -> None:
    bus, orch = stack
    assert orch.learned is not None and orch.rollout is not None
    for v in (1, 2):
        await announce(bus, tmp_path, v, keys)
    await wait_for(lambda: {1, 2} <= set(orch.learned.loaded), "v1 and v2 loaded")  # type: ignore[union-attr]
    topic = orch.config.rollout_topic
    # Candidate 2 on 100% of the non-baseline sessions; live 1.
    await publish_state(bus, topic, state(7, live="1", candidate="2", percent=100))
    await wait_for(lambda: orch.rollout.state is not None, "the staged state")  # type: ignore[union-attr]
    before, after = outside_baseline(3, "before"), outside_baseline(3, "after")
    big = max(tasks(), key=lambda t: len(t.subtasks))
    for sid in before:
        await submit(bus, sid, big)
    await wait_for(lambda: all(orch.is_running(s) for s in before), "sessions in flight")
    # The guardrails breach: rollback, candidate cleared, live stays 1.
    await publish_state(bus, topic, state(8, live="1"))
    await wait_for(lambda: orch.rollout.state.seq == 8, "the rollback")  # type: ignore[union-attr]
    still_running = [s for s in before if orch.is_running(s)]
    assert still_running, "the sessions ended before the rollback: nothing was in flight"
    for sid in after:
        await submit(bus, sid, big)
    old, new = await finished(orch, before), await finished(orch, after)
    for traj in old:
        assert traj.policy_version == "2" and {d.policy_version for d in traj.decisions} == {"2"}
        assert traj.arm.role == CANARY and traj.arm.rollout_seq == 7
        assert traj.labels["arm"] == "canary:2"
    for traj in new:
        assert traj.policy_version == "1" and traj.arm.role == LIVE
        assert traj.arm.rollout_seq == 8 and traj.labels["arm"] == "live:1"


async def test_the_state_written_before_start_routes_the_first_session(keys: KeyPair) -> None:
    bus = InProcBus()
    await bus.start()
    config = learned_config(keys, "first.orchestrator")
    await bus.create_topics([TopicSpec(config.rollout_topic, 1, config=COMPACT)])
    await publish_state(bus, config.rollout_topic, state(3, live="rules:greedy", baseline_bp=0))
    orch = OrchestratorApp(config, bus, serve_grpc=False)
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="first.subagent", shutdown_timeout_s=5.0), bus
    )
    await worker.start()
    await orch.start()
    try:
        assert orch.rollout is not None and orch.rollout.caught_up()
        sid = session_ids(1, seed="first")[0]
        await submit(bus, sid, tasks()[0])
        (traj,) = await finished(orch, [sid])
        assert traj.policy_version == "rules:greedy" and traj.labels["arm"] == "live:rules:greedy"
        assert traj.arm.rollout_seq == 3
    finally:
        await orch.stop()
        await worker.stop()
        await bus.stop()


async def test_a_rule_engine_deployment_records_its_live_arm() -> None:
    bus = InProcBus()
    await bus.start()
    orch = OrchestratorApp(
        OrchestratorConfig(bus_url="embedded", group_id="rules.orchestrator"),
        bus,
        serve_grpc=False,
    )
    worker = SubagentApp(
        SubagentConfig(bus_url="embedded", group_id="rules.subagent", shutdown_timeout_s=5.0), bus
    )
    await worker.start()
    await orch.start()
    try:
        assert orch.rollout is None  # nothing to route: one rule engine serves
        sid = session_ids(1, seed="rules")[0]
        await submit(bus, sid, tasks()[1])
        (traj,) = await finished(orch, [sid])
        assert traj.arm == Route("rules:cpls", LIVE, bucket(sid), 0).arm()
        assert traj.labels["arm"] == "live:rules:cpls"
        assert traj.decisions and all(d.decide_ms > 0 for d in traj.decisions)
    finally:
        await orch.stop()
        await worker.stop()
        await bus.stop()


def test_the_source_keeps_pinned_versions_and_the_newest_few(keys: KeyPair) -> None:
    source = LearnedPolicySource(default_pool().agent_names(), trusted=trusted(keys), keep_newest=3)
    source.pin(["2", "rules:cpls", ""])
    for v in range(1, 7):
        source._remember(Served(v, None, "", ""))  # type: ignore[arg-type]  # no net needed
    assert set(source.loaded) == {2, 4, 5, 6}  # 2 is pinned; 1 and 3 dropped
    source.pin(["5"])  # the state moved on: 2 is released
    assert set(source.loaded) == {4, 5, 6}
    assert source.available("5") and not source.available("2")
    assert source.available("rules:greedy") and not source.available("rules:nope")
    submitted = task_pb2.TaskSubmitted(session_id="s", submitted_by="grpc:x", seed=1)
    assert source.for_session(submitted, "rules:greedy").version == "rules:greedy"
    with pytest.raises(ProcessingError, match="version '2' is not loaded"):
        source.for_session(submitted, "2")
