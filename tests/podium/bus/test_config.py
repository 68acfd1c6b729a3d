"""Bus configuration, URL parsing and the broker tooling's local behaviour (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError, RecordTooLargeError

from podium.bus import InProcBus, KafkaBus, KafkaConfig, connect, is_kafka_url
from podium.bus.kafka import SASL_PASSWORD_ENV, bus_error
from podium.errors import BusError, ConfigError
from podium_app import cli, kafka_broker


def test_connect_picks_the_implementation_from_the_url() -> None:
    assert isinstance(connect("inproc://"), InProcBus)
    assert isinstance(connect("memory://"), InProcBus)
    bus = connect("kafka://10.0.0.1:9092,10.0.0.2:9092?client_id=svc&linger_ms=20")
    assert isinstance(bus, KafkaBus)
    assert bus.config.bootstrap_servers == "10.0.0.1:9092,10.0.0.2:9092"
    assert (bus.config.client_id, bus.config.linger_ms) == ("svc", 20)
    with pytest.raises(ConfigError, match="bus URL must be"):
        connect("redis://localhost:6379")


def test_is_kafka_url_is_decided_from_the_scheme() -> None:
    for url in ("kafka://h:1", "kafka://a:1,b:2?client_id=x", " KAFKA://h:1"):
        assert is_kafka_url(url), url
    for url in ("inproc://", "memory://", "", "h:9092", "kafkaesque://h:1", "redis://kafka://"):
        assert not is_kafka_url(url), url


def test_kafka_url_errors_name_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SASL_PASSWORD_ENV, raising=False)  # scripts/test.sh exports the broker's
    with pytest.raises(ConfigError, match="unknown or disallowed kafka URL parameter 'colour'"):
        KafkaConfig.from_url("kafka://h:1?colour=blue")
    with pytest.raises(ConfigError, match="sasl_password"):
        KafkaConfig.from_url("kafka://h:1?sasl_password=leaked")
    with pytest.raises(ConfigError, match="linger_ms='soon'"):
        KafkaConfig.from_url("kafka://h:1?linger_ms=soon")
    with pytest.raises(ConfigError, match="bootstrap_servers must be host:port"):
        KafkaConfig.from_url("kafka://justahost")
    # SASL needs credentials; the password comes from the environment, never the URL.
    with pytest.raises(ConfigError, match="needs sasl_username and sasl_password"):
        KafkaConfig.from_url("kafka://h:1?security_protocol=SASL_SSL&sasl_username=svc")
    monkeypatch.setenv(SASL_PASSWORD_ENV, "s3cret")
    cfg = KafkaConfig.from_url(
        "kafka://h:1?security_protocol=SASL_SSL&sasl_username=svc&sasl_mechanism=SCRAM-SHA-512"
    )
    kwargs = cfg.client_kwargs()
    assert kwargs["sasl_plain_password"] == "s3cret"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["ssl_context"] is not None  # SASL_SSL implies TLS


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("security_protocol", "TLS", "security_protocol must be one of"),
        ("isolation_level", "dirty", "isolation_level must be one of"),
        ("auto_offset_reset", "middle", "auto_offset_reset must be one of"),
        ("default_partitions", 0, "default_partitions must be >= 1"),
        ("heartbeat_interval_ms", 20_000, "heartbeat_interval_ms must be below"),
    ],
)
def test_kafka_config_validation(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KafkaConfig("h:1", **{field: value})  # type: ignore[arg-type]


def test_kafka_errors_keep_their_retriability() -> None:
    assert bus_error("publish", KafkaConnectionError("down")).retriable
    err = bus_error("publish", RecordTooLargeError())
    assert isinstance(err, BusError) and not err.retriable
    assert "RecordTooLargeError" in str(err)


async def test_buses_refuse_use_before_start() -> None:
    with pytest.raises(BusError, match="not started"):
        await InProcBus().publish("t", b"x")
    with pytest.raises(BusError, match="not started"):
        await KafkaBus("127.0.0.1:9").publish("t", b"x")


def test_fetch_is_idempotent_and_does_not_call_maven_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PODIUM_CACHE", str(tmp_path))
    libs = kafka_broker.kafka_home("0.0-test") / "libs"
    libs.mkdir(parents=True)
    (libs / ".complete").write_text("done")
    # With the marker present, fetch must not even look for mvn.
    monkeypatch.setattr(kafka_broker.shutil, "which", lambda _name: None)
    assert kafka_broker.fetch("0.0-test") == libs
    # Without it, a missing mvn is a clear error, not a traceback from subprocess.
    with pytest.raises(kafka_broker.BrokerError, match="`mvn`"):
        kafka_broker.fetch("0.0-other")


def test_cli_status_of_a_broker_that_is_not_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["kafka", "status", "--dir", str(tmp_path / "none")]) == 3
    assert "not running" in capsys.readouterr().out
    assert cli.main(["kafka", "stop", "--dir", str(tmp_path / "none")]) == 0
    capsys.readouterr()
    assert cli.main(["kafka", "start", "--dir", str(tmp_path), "--port", "70000"]) == 2
    assert "--port must be 0..65535, got 70000" in capsys.readouterr().err
