"""The dev broker's security, on a real broker of its own (``security="sasl_ssl"``):

* clients are served only over TLS with SCRAM-SHA-512: a wrong password is refused with a
  :class:`BusError` naming authentication (not retriable), and a plaintext client gets nothing;
* each service has its own principal with exactly its ACLs: reward may read trajectories and
  write scores, and is refused writing policy updates or joining another service's group;
* a service started with its own credentials file (``credentials/reward.env``) works end to
  end: ``python -m reward_svc`` scores trajectories in transactions under its own
  transactional ids.

Needs java and mvn (like the other own-broker tests), not ``$PODIUM_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kafka_helpers import kafka_url

from podium import codec, topics
from podium.bus import KafkaBus, TopicSpec, connect
from podium.bus.kafka import SASL_PASSWORD_ENV
from podium.errors import BusError
from podium.rewards.examples import EXAMPLES
from podium.v1 import reward_pb2
from podium_app import kafka_auth
from podium_app.kafka_broker import PASSWORD_ENV, KafkaBroker, metadata_brokers

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
FAST = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "join_timeout_s": 30}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    for tool in ("java", "mvn", "openssl"):
        if shutil.which(tool) is None:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true but `{tool}` is not installed")
            pytest.skip(f"`{tool}` is not installed")
    own = KafkaBroker(tmp_path_factory.mktemp("secure") / "broker", security="sasl_ssl")
    try:
        own.start()
        yield own
    finally:
        own.stop(timeout_s=15)


def _env_file(path: Path) -> dict[str, str]:
    """A credentials file (``NAME='value'`` lines) as a dict, read as a shell would."""
    return dict(shlex.split(line)[0].split("=", 1) for line in path.read_text().splitlines())


async def _bus_as(
    broker: KafkaBroker, user: str, monkeypatch: pytest.MonkeyPatch, password: str = ""
) -> KafkaBus:
    """A started bus logged in as ``user`` (its own password unless ``password`` is given)."""
    monkeypatch.setenv(SASL_PASSWORD_ENV, password or broker.passwords()[user])
    bus = connect(kafka_url(broker.client_url(user), **FAST))
    assert isinstance(bus, KafkaBus)
    await bus.start()
    return bus


@pytest.fixture
async def admin(broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KafkaBus]:
    bus = await _bus_as(broker, kafka_auth.ADMIN_USER, monkeypatch)
    try:
        yield bus
    finally:
        await bus.stop()


def test_password_variable_is_the_one_the_bus_reads() -> None:
    assert PASSWORD_ENV == SASL_PASSWORD_ENV


def test_every_service_gets_its_own_credentials_file(broker: KafkaBroker) -> None:
    for service in kafka_auth.SERVICES:
        env = _env_file(broker.credentials_env_file(service))
        assert f"sasl_username={service}&" in env["PODIUM_BUS"]
        assert "security_protocol=SASL_SSL" in env["PODIUM_BUS"]
        assert env[PASSWORD_ENV] == broker.passwords()[service]
        assert broker.credentials_env_file(service).stat().st_mode & 0o077 == 0
    assert broker.ca_file.stat().st_mode & 0o044 == 0o044  # any client may verify with it


async def test_wrong_password_is_refused_naming_authentication(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(BusError, match=r"authentication as 'reward' \(SCRAM-SHA-512\) refused"):
        await _bus_as(broker, "reward", monkeypatch, password="not-the-password")
    try:
        await _bus_as(broker, "reward", monkeypatch, password="not-the-password")
    except BusError as exc:
        assert not exc.retriable  # retrying a wrong password cannot help
    # The tooling's own SCRAM client is refused the same way, and plaintext gets no metadata.
    with pytest.raises(kafka_auth.AuthError, match="SCRAM authentication of 'admin' failed"):
        metadata_brokers(
            "127.0.0.1", broker.port, login=kafka_auth.Login(broker.ca_file, "admin", "wrong")
        )
    with pytest.raises((OSError, ValueError)):
        metadata_brokers("127.0.0.1", broker.port)


async def test_reward_reads_trajectories_writes_scores_and_nothing_else(
    broker: KafkaBroker, admin: KafkaBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The admin creates every topic first: a refusal below is authorization, not absence.
    await admin.create_topics([TopicSpec(t, 1) for t in topics.ALL])
    await admin.publish(topics.TRAJECTORIES, b"a trajectory", key="s-1")
    reward = await _bus_as(broker, "reward", monkeypatch)
    try:
        member = reward.subscriber([topics.TRAJECTORIES], "reward_svc.acl-test")
        await member.start()
        got = []
        for _ in range(20):
            got += await member.fetch(timeout_s=0.5)
            if got:
                break
        assert [r.value for r in got] == [b"a trajectory"]
        await member.commit()
        await member.stop()
        await reward.publish(topics.SCORED_TRAJECTORIES, b"a score", key="s-1")
        await reward.publish(topics.dead_letter(topics.TRAJECTORIES), b"poison", key="s-1")
        with pytest.raises(BusError, match="TopicAuthorizationFailed") as denied:
            await reward.publish(topics.POLICY_UPDATES, b"forged version", key="m")
        assert topics.POLICY_UPDATES in str(denied.value) and not denied.value.retriable
        foreign = reward.subscriber([topics.TRAJECTORIES], "learner")
        with pytest.raises(BusError, match="GroupAuthorizationFailed"):
            await foreign.start()
    finally:
        await reward.stop()
    # Nothing the refused calls tried reached the topic.
    assert await _values(admin, topics.POLICY_UPDATES) == []


async def _values(bus: KafkaBus, topic: str) -> list[bytes]:
    """Committed record values of ``topic`` (all partitions), read as the admin."""
    out: list[bytes] = []
    for partition in await bus.partitions(topic, wait_s=5):
        async for chunk in bus.read_range(topic, partition, 0):
            out += [r.value for r in chunk]
    return out


@pytest.mark.slow
async def test_reward_svc_runs_end_to_end_with_its_own_principal(
    broker: KafkaBroker, admin: KafkaBus, tmp_path: Path
) -> None:
    in_topic, out_topic = f"{topics.TRAJECTORIES}.e2e", f"{topics.SCORED_TRAJECTORIES}.e2e"
    await admin.create_topics([TopicSpec(in_topic, 2), TopicSpec(out_topic, 2)])
    builders = list(EXAMPLES.values())
    sent = set()
    for i in range(12):
        traj = builders[i % len(builders)]()
        traj.trajectory_id = traj.session_id = f"auth-{i:02d}"
        sent.add(traj.trajectory_id)
        _, data = codec.encode_event(traj, producer="test", key=traj.session_id)
        await admin.publish(in_topic, data, key=traj.session_id)
    own = _env_file(broker.credentials_env_file("reward"))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")},
        **own,
        "PYTHONPATH": str(ROOT),
        "PODIUM_BUS": kafka_url(own["PODIUM_BUS"], **FAST),
        "PODIUM_REWARD_IN_TOPIC": in_topic,
        "PODIUM_REWARD_OUT_TOPIC": out_topic,
        "PODIUM_REWARD_POLL_MS": "200",
        "PODIUM_INSTANCE": "reward-auth-test",
    }
    log = tmp_path / "reward_svc.log"
    proc = _start_reward_svc(env, log)
    try:
        scored: set[str] = set()
        for _ in range(120):  # ≤ 60 s, most of it the service's start
            assert proc.poll() is None, log.read_text()
            scored = {_scored_id(v) for v in await _values(admin, out_topic)}
            if scored >= sent:
                break
            await asyncio.sleep(0.5)
        assert scored == sent, log.read_text()[-3000:]
    finally:
        proc.terminate()
        code = await asyncio.to_thread(proc.wait, 30)
    assert code == 0, log.read_text()[-3000:]
    assert "Authorization" not in log.read_text()


def _start_reward_svc(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "reward_svc"], cwd=ROOT, env=env, stdout=fh, stderr=fh
        )


def _scored_id(value: bytes) -> str:
    _, scored = codec.decode_event(value, reward_pb2.ScoredTrajectory)
    return str(scored.trajectory.trajectory_id)  # type: ignore[attr-defined]
