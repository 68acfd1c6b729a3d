"""What a cluster would provide and the local deployment provides instead, each named.

Everything a rendered container says is used exactly as rendered, except these substitutions
(docs/operations.md, "The local deployment"):

1. **Strimzi's Kafka.** The ``Kafka`` resource's bootstrap Service
   (``<cluster>-kafka-bootstrap``, every listener port) resolves to the local broker's address;
   the Secrets the operators would make are made from the local broker's: the cluster CA
   (``<cluster>-cluster-ca-cert``, key ``ca.crt``) is the broker's CA certificate, and each
   ``KafkaUser``'s Secret (same name, key ``password``) holds that principal's password on
   the local broker (the same principals and ACLs: ``podium_app.kafka_auth``). So
   ``PODIUM_BUS`` keeps its rendered user, protocol, mechanism and CA path; only the host
   changes, through the Service table like any other.
2. **Operator Secrets.** A rendered Secret with a ``REPLACE-ME`` placeholder is one the
   operator must create (docs/operations.md); it is generated, by the shape of its keys:
   ``tls.crt``/``tls.key`` a CA-signed certificate for 127.0.0.1/localhost (the CA in
   ``<work>/grpc-tls/ca.pem`` for clients), ``ca.crt`` that CA, ``tokens.yaml`` a token table
   with a token per principal (``user``: plugin, an ordinary client; ``trainer``: plugin, so
   the sessions it submits are sampled for training, as ``PODIUM_POLICY_SAMPLE_FROM`` defaults;
   ``reviewer``; ``operator``; the tokens in ``<work>/tokens/<name>.token``), a
   ``<principal>.token`` that principal's token (the cold-start Job's ``operator.token``), a
   ``*.pem`` the policy signing key and a ``*.pub`` its public half (one pair,
   ``<work>/policy-keys``). Any other placeholder is an error.
3. **Non-Podium images.** The workload behind the Service that a Podium container's ``v2://``
   setting names (Triton, or a CPU KServe-V2 server) is the local V2 server: that Service's
   named port resolves to its gRPC address, a port named ``http`` to its HTTP address, and
   every PersistentVolumeClaim its pods mount is the V2 server's model repository (so the
   learner exports where the server loads). Other non-Podium workloads are not run (their
   Services resolve to a loopback port nothing serves), except the trace backend:
4. **The trace backend.** A Jaeger workload (image ``jaegertracing/all-in-one`` or
   ``jaegertracing/jaeger``) runs as the Jaeger binary ``scripts/jaeger.sh`` builds from the
   Go module proxy (Jaeger v2, itself an OpenTelemetry Collector distribution; found by
   :func:`find_jaeger`) with a generated config (:func:`jaeger_config`): in-memory storage,
   its OTLP/gRPC receiver on the container's ``otlp-grpc`` port, the query API and UI on its
   ``ui`` port, its health check on its HTTP readiness probe's port and path (so the rendered
   probe is what decides it is ready), each mapped through the pod's port table like a Podium
   container's. The OpenTelemetry Collector workload (image ``otel/opentelemetry-collector*``)
   is then not run: in the dev overlay it only forwards spans to Jaeger, so its Service
   resolves to Jaeger's OTLP/gRPC receiver. Without the binary, neither runs (as in 3).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from podium.errors import ConfigError
from podium.policy.signing import KeyPair, ensure_key_pair
from podium.service.auth import token_digest
from podium_app.deploy.manifest import (
    Container,
    Objects,
    Pod,
    Service,
    ServicePort,
    name_of,
    services,
)
from podium_app.kafka_auth import make_tls
from podium_app.kafka_broker import free_port

PLACEHOLDER = "REPLACE-ME"
"""How the manifests mark a Secret value the operator must provide."""

TOKEN_ROLES = {
    "user": ["plugin"],
    "trainer": ["plugin"],
    "reviewer": ["reviewer"],
    "operator": ["operator"],
}
"""The generated token table: principal -> roles."""


TLS_FILES = {"tls.crt": "broker.pem", "tls.key": "broker.key", "ca.crt": "ca.pem"}
"""Secret key -> the file of ``make_tls``'s directory it holds (certificate, key, CA)."""


@dataclass(frozen=True)
class BrokerAccess:
    """The local broker standing in for Strimzi's."""

    bootstrap: str
    """``host:port`` of its SASL_SSL listener."""
    ca_file: Path
    passwords: Mapping[str, str]
    """SCRAM user -> password."""


@dataclass(frozen=True)
class V2Access:
    """The local KServe-V2 server standing in for Triton."""

    grpc: str
    http: str
    repository: Path


@dataclass(frozen=True)
class OperatorFiles:
    """Where the generated operator material lies (clients of the deployment need it)."""

    tokens: Mapping[str, Path] = field(default_factory=dict)
    grpc_ca: Path | None = None
    policy_keys: KeyPair | None = None


def strimzi_secrets(objects: Objects, broker: BrokerAccess) -> dict[str, dict[str, str]]:
    """The cluster CA and KafkaUser Secrets the Strimzi operators would make."""
    out: dict[str, dict[str, str]] = {}
    ca = broker.ca_file.read_text()
    for kafka in objects.kind("Kafka"):
        out[f"{name_of(kafka)}-cluster-ca-cert"] = {"ca.crt": ca}
    for user in objects.kind("KafkaUser"):
        name = name_of(user)
        if name not in broker.passwords:
            raise ConfigError(
                f"KafkaUser {name!r} has no principal on the local broker (its principals: "
                f"{', '.join(sorted(broker.passwords))}); podium_app.kafka_auth.SERVICES must "
                "list it, as tests/k8s/test_k8s_kafka_auth.py requires"
            )
        out[name] = {"password": broker.passwords[name]}
    return out


def strimzi_services(objects: Objects) -> list[Service]:
    """The bootstrap Service of each ``Kafka`` resource, with its listeners' ports."""
    out = []
    for kafka in objects.kind("Kafka"):
        listeners = kafka.get("spec", {}).get("kafka", {}).get("listeners") or []
        ports = tuple(
            ServicePort(str(e.get("name", "")), int(e["port"]), int(e["port"])) for e in listeners
        )
        ns = str(kafka.get("metadata", {}).get("namespace") or "default")
        out.append(Service(f"{name_of(kafka)}-kafka-bootstrap", ns, {}, ports))
    return out


def is_placeholder(data: Mapping[str, str]) -> bool:
    return any(PLACEHOLDER in value for value in data.values())


def operator_secrets(
    objects: Objects, work: Path
) -> tuple[dict[str, dict[str, str]], OperatorFiles]:
    """Generated values for every placeholder Secret (see the module docstring)."""
    out: dict[str, dict[str, str]] = {}
    tokens: dict[str, Path] = {}
    grpc_ca: Path | None = None
    keys: KeyPair | None = None
    for name, data in objects.secrets.items():
        if not is_placeholder(data):
            continue
        made: dict[str, str] = {}
        for key in data:
            if key in TLS_FILES:
                tls = make_tls(work / "grpc-tls")
                grpc_ca = tls.ca
                made[key] = (work / "grpc-tls" / TLS_FILES[key]).read_text()
            elif key == "tokens.yaml":
                made[key], tokens = _token_table(work / "tokens")
            elif key.endswith(".token") and key.removesuffix(".token") in TOKEN_ROLES:
                _, tokens = _token_table(work / "tokens")
                made[key] = tokens[key.removesuffix(".token")].read_text()
            elif key.endswith(".pem"):
                keys = ensure_key_pair(work / "policy-keys")
                made[key] = keys.private_path.read_text()
            elif key.endswith(".pub"):
                keys = ensure_key_pair(work / "policy-keys")
                made[f"{keys.key_id}.pub"] = keys.public_path.read_text()
            else:
                raise ConfigError(
                    f"Secret {name!r} key {key!r} is a {PLACEHOLDER} placeholder the local "
                    "deployment does not know how to make"
                )
        out[name] = made
    return out, OperatorFiles(tokens, grpc_ca, keys)


def _token_table(directory: Path) -> tuple[str, dict[str, Path]]:
    import secrets

    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    rows = []
    for principal, roles in TOKEN_ROLES.items():
        path = directory / f"{principal}.token"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        paths[principal] = path
        rows.append(
            {"name": principal, "sha256": token_digest(path.read_text().strip()), "roles": roles}
        )
    return json.dumps({"tokens": rows}), paths


_V2_URL = re.compile(r"v2://([^\s,;/]+)")


def v2_services(containers: Sequence[Container], all_services: Sequence[Service]) -> dict[str, str]:
    """Service name -> the port name (or ``#<number>``) a Podium container's ``v2://`` setting
    targets, for each Service so named."""
    by_dns = {dns: s for s in all_services for dns in s.dns_names()}
    out: dict[str, str] = {}
    for c in containers:
        for _, value in c.env:
            for m in _V2_URL.finditer(value):
                parts = urlsplit(f"//{m.group(1)}")
                service = by_dns.get(parts.hostname or "")
                if service is None or parts.port is None:
                    continue
                for p in service.ports:
                    if p.port == parts.port:
                        out[service.name] = p.name or f"#{p.port}"
    return out


def selects(service: Service, pod: Pod) -> bool:
    """Whether ``service`` routes to ``pod`` (same namespace, selector matched)."""
    return (
        bool(service.selector)
        and service.namespace == pod.namespace
        and all(pod.labels.get(k) == v for k, v in service.selector.items())
    )


def all_services(objects: Objects) -> list[Service]:
    """The rendered Services plus Strimzi's bootstrap Services."""
    return services(objects) + strimzi_services(objects)


TRACE_BACKEND_IMAGES = ("jaegertracing/all-in-one", "jaegertracing/jaeger")
"""Image repositories of the trace backend the local deployment runs as the Jaeger binary."""
COLLECTOR_IMAGES = (
    "otel/opentelemetry-collector",
    "otel/opentelemetry-collector-contrib",
    "otel/opentelemetry-collector-k8s",
)
"""Image repositories of the OpenTelemetry Collector (a pass-through to the trace backend)."""
JAEGER_ENV = "PODIUM_JAEGER"
"""The Jaeger binary to run (``scripts/jaeger.sh`` prints it); unset: the cache's."""


def _repository(image: str) -> str:
    """``docker.io/jaegertracing/all-in-one:1.62.0`` -> ``jaegertracing/all-in-one``."""
    path = image.split("@", 1)[0]
    name = path.rsplit("/", 1)
    last = name[-1].split(":", 1)[0]
    parts = [*name[0].split("/")[-1:], last] if len(name) == 2 else [last]
    return "/".join(parts)


def is_trace_backend(image: str) -> bool:
    return _repository(image) in TRACE_BACKEND_IMAGES


def is_collector(image: str) -> bool:
    return _repository(image) in COLLECTOR_IMAGES


def find_jaeger(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$PODIUM_JAEGER`` (must be an executable: else :class:`ConfigError`), else
    ``${PODIUM_CACHE:-~/.cache/podium}/go-bin/jaeger`` where ``scripts/jaeger.sh`` installs
    it, else None (the trace backend is then not run)."""
    env = os.environ if environ is None else environ
    given = env.get(JAEGER_ENV, "")
    if given:
        if not os.access(given, os.X_OK):
            raise ConfigError(
                f"{JAEGER_ENV}={given!r} is not an executable (scripts/jaeger.sh installs one)"
            )
        return Path(given)
    cache = Path(env.get("PODIUM_CACHE") or Path.home() / ".cache" / "podium")
    binary = cache / "go-bin" / "jaeger"
    return binary if os.access(binary, os.X_OK) else None


@dataclass(frozen=True)
class JaegerPorts:
    """Where the local Jaeger listens (loopback ports)."""

    otlp_grpc: int
    """OTLP/gRPC receiver: the container's ``otlp-grpc`` port, what the collector forwards to."""
    otlp_http: int
    """OTLP/HTTP receiver (not in the manifest: a free port)."""
    query_http: int
    """The query API (``/api/traces/<id>``) and the UI: the container's ``ui`` port."""
    query_grpc: int
    """The query gRPC API (not in the manifest: a free port)."""
    health: int
    """The health check: the readiness probe's port."""
    health_path: str = "/"


def jaeger_ports(c: Container, table: Mapping[int, int]) -> JaegerPorts:
    """The local ports of the rendered Jaeger container ``c`` (its pod's port table)."""
    missing = [name for name in ("otlp-grpc", "ui") if name not in c.ports]
    if missing:
        raise ConfigError(
            f"{c.where}: the trace backend declares no container port named "
            f"{', '.join(missing)} (the local deployment puts Jaeger's OTLP receiver and query "
            "API there)"
        )
    probe = c.readiness
    if probe is None or probe.kind != "http":
        raise ConfigError(f"{c.where}: the trace backend needs an httpGet readiness probe")
    return JaegerPorts(
        otlp_grpc=table[c.ports["otlp-grpc"]],
        otlp_http=free_port(),
        query_http=table[c.ports["ui"]],
        query_grpc=free_port(),
        health=table[probe.port],
        health_path=probe.path or "/",
    )


def jaeger_config(ports: JaegerPorts) -> str:
    """A Jaeger v2 configuration (an OpenTelemetry Collector one) for the local deployment:
    OTLP in, in-memory storage, the query API, a health check; nothing on a fixed port (two
    deployments on one machine must not collide; the collector's own metrics are off for
    that reason)."""

    def at(port: int) -> dict[str, str]:
        return {"endpoint": f"127.0.0.1:{port}"}

    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {
                "resource": {"service.name": "jaeger"},
                "metrics": {"level": "none"},
                "logs": {"level": "info"},
            },
        },
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100000}}}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "http": at(ports.query_http),
                "grpc": at(ports.query_grpc),
            },
            "healthcheckv2": {**at(ports.health), "path": ports.health_path},
        },
        "receivers": {
            "otlp": {"protocols": {"grpc": at(ports.otlp_grpc), "http": at(ports.otlp_http)}}
        },
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }
    return yaml.safe_dump(config, sort_keys=False)


__all__ = [
    "COLLECTOR_IMAGES",
    "JAEGER_ENV",
    "PLACEHOLDER",
    "TOKEN_ROLES",
    "TRACE_BACKEND_IMAGES",
    "BrokerAccess",
    "JaegerPorts",
    "OperatorFiles",
    "V2Access",
    "all_services",
    "find_jaeger",
    "is_collector",
    "is_placeholder",
    "is_trace_backend",
    "jaeger_config",
    "jaeger_ports",
    "operator_secrets",
    "selects",
    "strimzi_secrets",
    "strimzi_services",
    "v2_services",
]
