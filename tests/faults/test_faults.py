"""The fault suite: the services as processes on a real broker behind a cuttable proxy, each
scenario a fault injected while sessions are in flight, each audited by reading every topic
back under read_committed (tests/faults/audit.py): 0 sessions lost, 0 run twice, 0 scored
twice or never, one trace per session, every poison record dead-lettered once.

Each scenario: start the services; submit a first wave of sessions; once some have completed
and others are in flight, inject the fault and heal it; submit a second wave at the heal (its
completion times, from the heal, are the recovery figures); wait for every trajectory; stop
the services gracefully; audit. A row per scenario goes to the session's table
(``<pytest tmp>/faults-table.md``, printed at the end).

Run: ``python -m pytest tests/faults -m faults -p no:cacheprovider`` (needs what the Kafka
tests need; every scenario starts a broker of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import pytest
from audit import Audit, audit_broker
from harness import Cluster, Load, recovery

from podium import codec, topics
from podium.v1 import reward_pb2, subtask_pb2, task_pb2, trajectory_pb2

pytestmark = [pytest.mark.faults, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]

FIRST_WAVE = 80
"""Sessions submitted before the fault (spread over :data:`FIRST_WAVE_S`)."""
FIRST_WAVE_S = 4.0
SECOND_WAVE = 40
"""Sessions submitted at the heal: the recovery figures."""
IN_FLIGHT = 8
"""The fault waits until at least this many sessions are running."""

Fault = Callable[[Cluster, Load], Awaitable[None]]
"""Injects a fault and heals it; returns at the heal."""


@dataclass
class Scenario:
    """What a scenario runs: its fault, and how the services are deployed around it."""

    name: str
    """Test id and table row."""
    fault: Fault
    """Injected once sessions are in flight; returns at the heal."""
    reward_replicas: int = 1
    """reward_svc processes (``reward-1``, ``reward-2``, ...), one consumer group."""
    reward_env: Mapping[str, str] = field(default_factory=dict)
    """Extra settings of every reward_svc replica."""
    orchestrator_env: Mapping[str, str] = field(default_factory=dict)
    """Extra settings of the orchestrator."""
    subagent_time_scale: float = 0.002
    """Wall seconds per simulated time unit of a sub-agent execution: sessions last a moment,
    so a fault finds some running and many queued."""
    poison: Callable[[Load], Awaitable[dict[str, list[str]]]] | None = None
    """Publishes poison records mid-stream; returns topic -> keys that must be dead-lettered."""
    during_load: bool = False
    """Inject the fault while the first wave is still being submitted (churn)."""


def _start_services(cluster: Cluster, s: Scenario) -> None:
    svc = cluster.services
    svc.subagent(time_scale=s.subagent_time_scale)
    for i in range(s.reward_replicas):
        svc.reward(f"reward-{i + 1}", **s.reward_env)
    env = dict(s.orchestrator_env)
    if env.get("PODIUM_POLICY") == "learned":
        env["PODIUM_POLICY_TRUSTED_KEYS"] = svc.trusted_keys()
    svc.orchestrator(**env)


async def _stop_services(cluster: Cluster) -> None:
    """Graceful stops (orchestrator first, so its last trajectories are published)."""
    svc = cluster.services
    for name in sorted(svc.procs, key=lambda n: not n.startswith("orch")):
        await asyncio.to_thread(svc.stop, name)


async def run_scenario(
    cluster: Cluster, s: Scenario, fault_table: Callable[..., None]
) -> tuple[Audit, dict[str, object]]:
    """Run ``s`` and audit it; records the table row and returns the audit and the row."""
    t0 = time.monotonic()
    _start_services(cluster, s)
    supervisor = asyncio.create_task(cluster.services.supervise())
    load = Load(cluster.admin, s.name)
    await load.start()
    poison: dict[str, list[str]] = {}
    try:
        first = asyncio.create_task(load.submit(FIRST_WAVE, over_s=FIRST_WAVE_S))
        if s.poison is not None:
            poison = await s.poison(load)
        if not s.during_load:
            await first
        in_flight = await load.wait_in_flight(IN_FLIGHT, timeout_s=60)
        await s.fault(cluster, load)
        healed = time.monotonic()
        await first
        second = await load.submit(SECOND_WAVE)
        await load.wait_done()  # or gave up: the audit counts what is missing
        p50, p99 = recovery(load, second, healed)
    finally:
        supervisor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await supervisor
        await load.stop()
    await _stop_services(cluster)
    result = await audit_broker(cluster.admin, load.submitted, poison)
    row: dict[str, object] = {
        "scenario": s.name,
        "result": "PASS" if _passes(s, result, cluster) else "FAIL",
        **{k: getattr(result, k) for k in _AUDIT_COLUMNS},
        "in_flight": in_flight,
        "p50": p50,
        "p99": p99,
        "wall": time.monotonic() - t0,
        "restarts": ", ".join(cluster.services.restarts) or "-",
        "proxied": cluster.proxy.connections,
    }
    fault_table(**row)
    print(f"\n{s.name}: {row}\nexamples: {result.examples}")
    return result, row


_AUDIT_COLUMNS = (
    "submitted",
    "trajectories",
    "lost",
    "run_twice",
    "unscored",
    "scored_twice",
    "trace_split",
    "poison",
    "dead_letters",
)


def _passes(s: Scenario, result: Audit, cluster: Cluster) -> bool:
    return result.clean and not (s.poison is not None and cluster.services.restarts)


def assert_clean(cluster: Cluster, s: Scenario, result: Audit, row: Mapping[str, object]) -> None:
    """0 lost, 0 twice, one trace per session, poison accounted; and poison never makes a
    service exit (elsewhere an exit and its restart are reported, not failed)."""
    logs = {n: cluster.services.tail(n, 1500) for n in cluster.services.procs}
    detail = f"{row}\nexamples: {result.examples}\nlogs: {logs}"
    assert result.lost == 0, f"sessions lost: {detail}"
    assert result.run_twice == 0, f"sessions run twice: {detail}"
    assert result.unscored == 0, f"trajectories never scored: {detail}"
    assert result.scored_twice == 0, f"trajectories scored twice: {detail}"
    assert result.trace_split == 0, f"sessions without one trace: {detail}"
    assert result.poison_missing == 0 and result.poison_repeated == 0, f"poison: {detail}"
    if s.poison is not None:
        assert row["restarts"] == "-", f"poison made a service exit: {detail}"
    assert row["proxied"], "the services never went through the proxy: the faults missed them"


# -- faults -------------------------------------------------------------------------------------


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


async def broker_kill9(cluster: Cluster, load: Load) -> None:
    cluster.kill9_broker()
    await _sleep(3)
    await asyncio.to_thread(cluster.restart_broker)


async def broker_stall_20s(cluster: Cluster, load: Load) -> None:
    cluster.pause_broker()
    await _sleep(20)
    cluster.resume_broker()


async def partition(cluster: Cluster, load: Load) -> None:
    """15 s of silence (packets dropped), then 5 s of refused connections."""
    cluster.proxy.blackhole()
    await _sleep(15)
    cluster.proxy.cut()
    await _sleep(5)
    cluster.proxy.heal()


def _kill_and_restart(name: str, start: Callable[[Cluster], None]) -> Fault:
    async def fault(cluster: Cluster, load: Load) -> None:
        cluster.services.kill9(name)
        await _sleep(1)
        start(cluster)

    return fault


async def rebalance_churn(cluster: Cluster, load: Load) -> None:
    """10 joins and leaves of a second reward_svc replica while sessions flow."""
    for _ in range(5):
        cluster.services.reward("reward-2")
        await _sleep(3)
        await asyncio.to_thread(cluster.services.stop, "reward-2")
        await _sleep(1)


COPIER_ENV = {"PODIUM_REWARD_RECORD_DELAY_MS": "10", "PODIUM_REWARD_MAX_BATCH": "10"}
"""Small, slow transactions (about 10 commits a second): a kill lands inside one, or inside
its commit, rather than between batches."""


def _copier(cluster: Cluster) -> None:
    cluster.services.reward("reward-1", **COPIER_ENV)


async def copier_kill9_thrice(cluster: Cluster, load: Load) -> None:
    """The transactional copier killed three times, restarted each time with the same
    transactional id (fencing its previous incarnation)."""
    for _ in range(3):
        cluster.services.kill9("reward-1")
        _copier(cluster)
        await _sleep(4)


async def copier_kill9_with_broker_bounce(cluster: Cluster, load: Load) -> None:
    cluster.services.kill9("reward-1")
    cluster.kill9_broker()
    await _sleep(2)
    await asyncio.to_thread(cluster.restart_broker)
    _copier(cluster)


async def issue_combination(cluster: Cluster, load: Load) -> None:
    """The issue's sequence on one replica: a partition, a broker stall, a broker kill -9."""
    cluster.proxy.blackhole()
    await _sleep(10)
    cluster.proxy.heal()
    await _sleep(2)
    cluster.pause_broker()
    await _sleep(10)
    cluster.resume_broker()
    await _sleep(2)
    cluster.kill9_broker()
    await _sleep(1)
    await asyncio.to_thread(cluster.restart_broker)


async def zombie_replica(cluster: Cluster, load: Load) -> None:
    """reward-1 paused (mid-transaction) past its session timeout: its partitions move to
    reward-2; then it wakes up and carries on with what it held."""
    import signal

    cluster.services.signal("reward-1", signal.SIGSTOP)
    await _sleep(12)
    cluster.services.signal("reward-1", signal.SIGCONT)
    await _sleep(3)


async def no_fault(cluster: Cluster, load: Load) -> None:
    return None


# -- poison ---------------------------------------------------------------------------------------


def _envelope(payload: object, key: str) -> bytes:
    return codec.encode_event(payload, producer="fault-poison", key=key)[1]  # type: ignore[arg-type]


POISON_TOPICS = (
    topics.TASKS,
    topics.SUBTASKS_ASSIGNED,
    topics.SUBTASK_RESULTS,
    topics.TRAJECTORIES,
    topics.SCORED_TRAJECTORIES,
    topics.POLICY_UPDATES,
)
"""Every topic a service of the deployment consumes (the policy topic: the learned policy)."""


def _poison_records(topic: str) -> dict[str, bytes]:
    """Records that must be dead-lettered, by key: garbage bytes, a well-framed envelope of the
    wrong event type, and one of the right type whose content is invalid where the consumer
    must refuse it."""
    short = topic.removeprefix("podium.").removesuffix(".v1")
    wrong = reward_pb2.Feedback(session_id="poison", comment="not this topic's event")
    records = {
        f"poison-{short}-garbage": b"\x00\xffnot an envelope\x13\x37" * 3,
        f"poison-{short}-wrong-type": _envelope(wrong, f"poison-{short}-wrong-type"),
    }
    if topic == topics.TASKS:
        key = f"poison-{short}-no-session"
        records[key] = _envelope(task_pb2.TaskSubmitted(session_id=""), key)
    return records


def _harmless_records() -> dict[str, list[tuple[str, bytes]]]:
    """Well-framed events with invalid content that a consumer may process or refuse, but that
    must never stop it (the issue's policy_version="²" trajectory among them)."""
    traj = trajectory_pb2.Trajectory(
        trajectory_id="poison-traj-superscript", session_id="poison-traj-superscript"
    )
    traj.policy_version = "²"
    result = subtask_pb2.SubtaskResult(session_id="poison-no-such-session", execution_id="x")
    update = reward_pb2.PolicyUpdated(model_name="swarm", version=1, uri="file:///nonexistent")
    return {
        topics.TRAJECTORIES: [("poison-traj-superscript", _envelope(traj, "t"))],
        topics.SUBTASK_RESULTS: [("poison-results-unknown", _envelope(result, "r"))],
        topics.POLICY_UPDATES: [("poison-policy-no-hash", _envelope(update, "p"))],
    }


async def publish_poison(load: Load) -> dict[str, list[str]]:
    """Publish the poison records of every consumed topic; the keys that must be dead-lettered."""
    # Once sessions complete: every consumer has joined and fixed its position (per-replica
    # groups start at the topic's end), so the poison lands mid-stream, in front of them.
    await load.wait_in_flight(0, timeout_s=60)
    accounted: dict[str, list[str]] = {}
    for topic in POISON_TOPICS:
        for key, value in _poison_records(topic).items():
            await load.publish_raw(topic, key, value)
            accounted.setdefault(topic, []).append(key)
    for topic, records in _harmless_records().items():
        for key, value in records:
            await load.publish_raw(topic, key, value)
    return accounted


# -- the scenarios --------------------------------------------------------------------------------


def _orchestrator(cluster: Cluster) -> None:
    cluster.services.orchestrator()


def _subagent(cluster: Cluster) -> None:
    cluster.services.subagent()


SCENARIOS = [
    Scenario("broker_kill9", broker_kill9),
    Scenario("broker_sigstop_20s", broker_stall_20s),
    Scenario("client_broker_partition", partition),
    Scenario("subagent_kill9_mid_batch", _kill_and_restart("sub-1", _subagent)),
    Scenario("orchestrator_kill9_mid_batch", _kill_and_restart("orch-1", _orchestrator)),
    Scenario("rebalance_churn_10", rebalance_churn, during_load=True),
    Scenario("copier_kill9_x3", copier_kill9_thrice, reward_env=COPIER_ENV),
    Scenario("copier_kill9_broker_bounce", copier_kill9_with_broker_bounce, reward_env=COPIER_ENV),
    Scenario("zombie_replica", zombie_replica, reward_replicas=2, reward_env=COPIER_ENV),
    Scenario("partition_stall_kill9_combined", issue_combination, reward_env=COPIER_ENV),
    Scenario(
        "poison_every_topic",
        no_fault,
        orchestrator_env={"PODIUM_POLICY": "learned"},
        poison=publish_poison,
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_fault(
    cluster: Cluster, scenario: Scenario, fault_table: Callable[..., None]
) -> None:
    result, row = await run_scenario(cluster, scenario, fault_table)
    assert_clean(cluster, scenario, result, row)
