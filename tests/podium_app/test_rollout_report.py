"""``podium rollout report`` from real topic content: a rollout walked by the machine
functions of :mod:`podium.rollout.machine` (state and transition per step, as the controller
writes them) and scored sessions on every arm, read back from the bus (both implementations)
and turned into ``report.html`` and its plots; the command itself against the real broker."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from podium import topics
from podium.bus import Bus, KafkaBus, KafkaConfig
from podium.codec import encode_event
from podium.errors import ConfigError
from podium.rollout import (
    RolloutSettings,
    advance,
    initial_state,
    offline_checked,
    propose,
    rollback,
    shadow_done,
)
from podium.v1 import reward_pb2, rollout_pb2, trajectory_pb2
from podium_app import rollout_report as rr
from podium_app.cli import main

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PNG = b"\x89PNG\r\n\x1a\n"


def _walk() -> list[tuple[rollout_pb2.RolloutState, rollout_pb2.RolloutTransition]]:
    """Cold start -> candidate 7 proposed -> offline passed -> shadow passed -> 1% -> 5% ->
    a guardrail breach rolls it back; ten minutes between steps."""
    at = [T0 + timedelta(minutes=10 * i) for i in range(8)]
    s = initial_state(RolloutSettings(), at[0], "controller-a")
    steps = []
    s, t = propose(s, "7", "cycle 1 candidate", "controller", at[1])
    steps.append((s, t))
    offline = rollout_pb2.Evidence(
        summary="offline: 100 twins", figures={"paired_mean": 0.05, "lower_bound": 0.01}
    )
    s, t = offline_checked(s, True, offline, at[2])
    steps.append((s, t))
    shadow = rollout_pb2.Evidence(
        summary="kept its advantage over 500 sessions",
        figures={"paired_mean": 0.04, "lower_bound": 0.015, "sessions": 500},
    )
    s, t = shadow_done(s, True, shadow, at[3])
    steps.append((s, t))
    clean = rollout_pb2.Evidence(summary="200 canary sessions, no breach")
    clean.guardrails.add(
        name="incomplete", canary_mean=0.02, baseline_mean=0.02, canary_n=200, baseline_n=900
    )
    s, t = advance(s, clean, at[4])
    steps.append((s, t))
    breach = rollout_pb2.Evidence(summary="latency_ratio breached")
    breach.guardrails.add(
        name="latency_ratio",
        canary_mean=2.4,
        baseline_mean=1.2,
        canary_n=80,
        baseline_n=300,
        statistic=7.5,
        threshold=4.6,
        breached=True,
    )
    breach.guardrails.add(name="incomplete", canary_mean=0.03, baseline_mean=0.02)
    s, t = rollback(s, "guardrail latency_ratio breached", breach, at[5], "controller")
    steps.append((s, t))
    return steps


def _scored(i: int, role: trajectory_pb2.ArmRole.ValueType, version: str, ended: datetime) -> bytes:
    traj = trajectory_pb2.Trajectory(
        trajectory_id=f"t{i}",
        session_id=f"s{i}",
        completed=i % 10 != 0,
        latency=12.0,
        lower_bound=10.0,
        policy_version=version,
    )
    if role != trajectory_pb2.ARM_ROLE_UNSPECIFIED:
        traj.arm.CopyFrom(trajectory_pb2.Arm(policy_version=version, role=role, rollout_seq=3))
    traj.ended_at.FromDatetime(ended)
    return encode_event(reward_pb2.ScoredTrajectory(trajectory=traj, total=-1.2), producer="t")[1]


async def _write(bus: Bus, rollout_topic: str, scored_topic: str) -> None:
    """The walk on the rollout topic and 60 sessions over the hour on the scored topic: live
    and baseline throughout, canary while staged, and 5 sessions without an arm."""
    for state, transition in _walk():
        key = f"transition:{transition.seq:012d}"
        await bus.publish(rollout_topic, encode_event(transition, producer="t")[1], key=key)
        await bus.publish(rollout_topic, encode_event(state, producer="t")[1], key="state")
    live, canary, base = (
        trajectory_pb2.ARM_ROLE_LIVE,
        trajectory_pb2.ARM_ROLE_CANARY,
        trajectory_pb2.ARM_ROLE_BASELINE,
    )
    for i in range(60):
        ended = T0 + timedelta(minutes=i)
        staged = 30 <= i < 50  # between shadow passed and the rollback
        role = base if i % 5 == 0 else (canary if staged and i % 2 else live)
        version = "7" if role == canary else "rules:cpls"
        await bus.publish(scored_topic, _scored(i, role, version, ended), key=f"s{i}")
    for i in range(60, 65):
        ended = T0 + timedelta(minutes=i)
        await bus.publish(
            scored_topic,
            _scored(i, trajectory_pb2.ARM_ROLE_UNSPECIFIED, "3", ended),
            key=f"s{i}",
        )
    await bus.publish(scored_topic, b"not an envelope", key="junk")


def _check_report(out: Path) -> str:
    for name in ("arms.png", "guardrails.png", "shadow.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    page = (out / "report.html").read_text()
    for section in ("Arms over time", "Stage transitions", "Guardrails", "Shadow evidence"):
        assert f"<h2>{section}</h2>" in page, section
    for kind in ("candidate_proposed", "offline_passed", "shadow_passed", "stage_advanced"):
        assert kind in page, kind
    assert "rolled_back" in page and "guardrail latency_ratio breached" in page
    assert "kept its advantage over 500 sessions" in page
    assert "paired_mean = 0.04" in page and "lower_bound = 0.015" in page
    assert "class=breach" in page  # the breached reading stands out
    assert "canary:7" in page and "baseline:rules:cpls" in page
    assert "5 sessions without an arm" in page and "1 records not" in page
    return page


async def test_report_from_the_topics(bus: Bus, unique: object, tmp_path: Path) -> None:
    rollout_topic, scored_topic = (
        f"{topics.ROLLOUT}.{uuid.uuid4().hex[:8]}",
        f"sc.{uuid.uuid4().hex[:8]}",
    )
    if isinstance(bus, KafkaBus):
        await bus.ensure_topics([rollout_topic, scored_topic])
    await _write(bus, rollout_topic, scored_topic)
    said: list[str] = []
    history = await rr.collect(bus, rollout_topic, scored_topic, said.append)
    assert [rr.kind_name(t.kind) for t in history.transitions] == [
        "CANDIDATE_PROPOSED",
        "OFFLINE_PASSED",
        "SHADOW_PASSED",
        "STAGE_ADVANCED",
        "ROLLED_BACK",
    ]
    assert history.state is not None and history.state.seq == 6
    assert history.state.stage == rollout_pb2.ROLLOUT_STAGE_IDLE
    assert len(history.sessions) == 60 and history.unrouted == 5 and history.undecodable == 1
    assert [s.ended_at for s in history.sessions] == sorted(s.ended_at for s in history.sessions)
    # The progress line counts every record read, the undecodable one included (60 + 5 + 1);
    # matched exactly: a random topic name or a duration may contain any digits.
    assert any(line.startswith(f"{scored_topic}: 66 records read in ") for line in said)
    _check_report(rr.write_report(history, tmp_path / "report").parent)


def test_arm_shares_are_per_bucket_shares() -> None:
    def row(t: float, label: str) -> rr.SessionRow:
        return rr.SessionRow(ended_at=t, label=label, role=1, reward=0.0, metrics={})

    rows = [row(0, "a"), row(1, "b"), row(2, "a"), row(3, "a"), row(10, "b")]
    starts, shares = rr.arm_shares(rows, 5.0)
    assert starts == [0.0, 10.0]  # the empty bucket [5, 10) is left out
    assert shares == {"a": [0.75, 0.0], "b": [0.25, 1.0]}
    assert rr.arm_shares([], 5.0) == ([], {})
    with pytest.raises(ConfigError, match="time bucket must be > 0"):
        rr.arm_shares(rows, 0.0)


def test_an_empty_history_still_makes_a_report(tmp_path: Path) -> None:
    page = (rr.write_report(rr.RolloutHistory(), tmp_path)).read_text()
    assert "No rollout state on the topic yet" in page
    assert "No transition carried guardrail readings." in page
    assert (tmp_path / "arms.png").read_bytes().startswith(PNG)


def test_the_command_refuses_a_bus_that_is_not_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rollout", "report", "--bus", "inproc://", "--out", str(tmp_path)]) == 2
    assert "--bus must be kafka://" in capsys.readouterr().err
    assert not (tmp_path / "report.html").exists()


@pytest.mark.kafka
def test_the_command_on_the_real_broker(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = f"report-{uuid.uuid4().hex[:8]}"
    rollout_topic = f"{topics.ROLLOUT}.{tag}"
    scored_topic = f"{topics.SCORED_TRAJECTORIES}.{tag}"  # what --topic-suffix reads

    async def write() -> None:
        bus = KafkaBus(KafkaConfig.from_url(kafka_bootstrap))
        await bus.start()
        try:
            await bus.ensure_topics([rollout_topic, scored_topic])
            await _write(bus, rollout_topic, scored_topic)
        finally:
            await bus.stop()

    asyncio.run(write())
    out = tmp_path / "report"
    argv = ["rollout", "report", "--bus", kafka_bootstrap, "--out", str(out)]
    rc = main([*argv, "--rollout-topic", rollout_topic, "--topic-suffix", tag])
    assert rc == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "report.html")
    assert f"{scored_topic}: 66 records read" in captured.err
    _check_report(out)
