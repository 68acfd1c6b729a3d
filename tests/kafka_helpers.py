"""How tests reach the real broker: one place that turns ``$PODIUM_KAFKA_BOOTSTRAP`` (a
``kafka://`` URL carrying the security settings, the password in
``$PODIUM_KAFKA_SASL_PASSWORD``) into what each kind of client needs.

* :func:`kafka_url`: a URL with extra ``?field=value`` settings, for ``PODIUM_BUS`` of a
  service process or :func:`podium.bus.connect`;
* :func:`client_kwargs`: keyword arguments for a raw aiokafka client (tests that read topics
  back without Podium's bus);
* :func:`librdkafka_config`: the settings of a librdkafka client (``confluent_kafka``);
* :func:`console_consumer`: the command line of Kafka's own console consumer (the broker's
  release, Java), an outside reader of what Podium writes;
* :func:`bus_env`: ``PODIUM_BUS`` plus the password, for a service process whose environment
  is otherwise stripped of ``PODIUM_*``.

All of them go through :class:`podium.bus.KafkaConfig`, so a test connects exactly as a service
configured with the same URL would.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from podium.bus import KafkaConfig
from podium.bus.kafka import SASL_PASSWORD_ENV
from podium_app.kafka_auth import ADMIN_USER
from podium_app.kafka_broker import KafkaBroker, fetch


def as_url(bootstrap: str) -> str:
    """``kafka://host:port`` for a bare ``host:port``; a ``kafka://`` URL unchanged."""
    bootstrap = bootstrap.strip()
    return bootstrap if "://" in bootstrap else f"kafka://{bootstrap}"


def kafka_url(base: str, **params: object) -> str:
    """``base`` with ``params`` set in its query (replacing parameters of the same name)."""
    parts = urlsplit(as_url(base))
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    query.update({k: str(v) for k, v in params.items()})
    return parts._replace(query=urlencode(query, safe="/")).geturl()


def config_for(base: str, **overrides: Any) -> KafkaConfig:
    """The :class:`KafkaConfig` a service given ``base`` would use, with ``overrides``."""
    return dataclasses.replace(KafkaConfig.from_url(as_url(base)), **overrides)


def broker_config(broker: KafkaBroker, user: str = ADMIN_USER, **overrides: Any) -> KafkaConfig:
    """How to connect as ``user`` to a broker a test started itself (its own password, not
    the shared broker's ``$PODIUM_KAFKA_SASL_PASSWORD``)."""
    password = broker.passwords().get(user) if broker.secure else None
    config = KafkaConfig.from_url(broker.client_url(user), sasl_password=password)
    return dataclasses.replace(config, **overrides)


def credentials_env(broker: KafkaBroker, user: str) -> dict[str, str]:
    """``user``'s ``credentials/<user>.env`` of a broker a test started (``PODIUM_BUS`` and the
    password), read as a shell would: what an operator hands that service."""
    path = broker.credentials_env_file(user)
    lines = path.read_text().splitlines()
    return dict(shlex.split(line)[0].split("=", 1) for line in lines if line.strip())


def client_kwargs(base: str) -> dict[str, Any]:
    """Connection keyword arguments (brokers, TLS, SASL) for aiokafka's clients."""
    return config_for(base).client_kwargs()


def librdkafka_config(base: str) -> dict[str, str]:
    """Brokers and security settings of a librdkafka client (``confluent_kafka.Producer``)."""
    cfg = config_for(base)
    settings = {"bootstrap.servers": cfg.bootstrap_servers}
    if cfg.security_protocol != "PLAINTEXT":
        settings["security.protocol"] = cfg.security_protocol.lower()
    if cfg.security_protocol.startswith("SASL"):
        settings["sasl.mechanisms"] = cfg.sasl_mechanism
        settings["sasl.username"] = cfg.sasl_username or ""
        settings["sasl.password"] = cfg.sasl_password or ""
    if cfg.ssl_cafile:
        settings["ssl.ca.location"] = cfg.ssl_cafile
    return settings


def java_client_properties(base: str) -> str:
    """The Java client's settings for ``base``: the ``--command-config`` file of Kafka's tools."""
    cfg = config_for(base)
    lines = [f"security.protocol={cfg.security_protocol}"]
    if cfg.security_protocol.startswith("SASL"):
        module = (
            "scram.ScramLoginModule"
            if cfg.sasl_mechanism.startswith("SCRAM")
            else "plain.PlainLoginModule"
        )
        lines += [
            f"sasl.mechanism={cfg.sasl_mechanism}",
            f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
            f'username="{cfg.sasl_username}" password="{cfg.sasl_password}";',
        ]
    if cfg.ssl_cafile:
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={cfg.ssl_cafile}"]
    return "\n".join(lines) + "\n"


def console_consumer(base: str, workdir: Path, *args: str) -> list[str]:
    """The command line of Kafka's console consumer (``kafka-console-consumer.sh``), from the
    jars of the pinned release (:func:`podium_app.kafka_broker.fetch`), reading ``base``; its
    settings file (it holds the password) is written under ``workdir`` with mode 0600."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("`java` is not on PATH: Kafka's console consumer needs it")
    settings = workdir / "console-consumer.properties"
    settings.touch(mode=0o600)
    settings.write_text(java_client_properties(base))
    return [
        *(java, "-cp", f"{fetch()}/*", "org.apache.kafka.tools.consumer.ConsoleConsumer"),
        *("--bootstrap-server", config_for(base).bootstrap_servers),
        *("--command-config", str(settings)),
        *args,
    ]


def bus_env(url: str) -> dict[str, str]:
    """``PODIUM_BUS=url`` and, when set, ``$PODIUM_KAFKA_SASL_PASSWORD``: a service process's
    connection, for an environment built without the caller's ``PODIUM_*`` variables."""
    env = {"PODIUM_BUS": url}
    if password := os.environ.get(SASL_PASSWORD_ENV):
        env[SASL_PASSWORD_ENV] = password
    return env


def kafka_test_config(bootstrap: str, **overrides: object) -> KafkaConfig:
    """Kafka settings tuned for tests: fast heartbeats so rebalances settle in about a second.

    ``bootstrap`` is a ``kafka://`` URL (its security settings kept) or a bare ``host:port``.
    """
    settings: dict[str, object] = {
        "client_id": "podium-tests",
        "heartbeat_interval_ms": 250,
        "session_timeout_ms": 6000,  # the broker's group.min.session.timeout.ms default
        "revoke_grace_s": 3.0,
        "join_timeout_s": 30.0,
    }
    settings.update(overrides)
    return dataclasses.replace(KafkaConfig.from_url(as_url(bootstrap)), **settings)  # type: ignore[arg-type]
