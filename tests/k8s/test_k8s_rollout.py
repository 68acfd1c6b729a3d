"""The rollout pieces in k8s/, as rendered by kustomize: the rollout controller's Deployment
(one replica replaced with Recreate, probes on its health port, limits, non-root, its own Kafka
user, a Service for RolloutService), gRPC tokens and TLS from Secrets on the orchestrator and
the controller, the orchestrator routing by the rollout, and the learner following it. Every
setting the manifests give is one the services read."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_kustomize import _render, _secrets, _workloads

from learner_svc.config import MODES, LearnerConfig, LoopSettings
from learner_svc.rollout.config import ControllerSettings
from orchestrator_svc.config import OrchestratorConfig
from podium import topics
from podium.bus import KafkaConfig
from podium_app.kafka_auth import service_grants

TOKENS_SECRET = "podium-grpc-tokens"
TLS_SECRET = "podium-grpc-tls"
TRUSTED_SECRET = "podium-policy-trusted-keys"


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    (container,) = [
        c
        for c in dep["spec"]["template"]["spec"]["containers"]
        if c["name"] == dep["metadata"]["name"]
    ]
    return container


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _read_by(*classes: type[Any]) -> set[str]:
    """The environment variables ``classes`` read."""
    return {
        f.metadata["env"] for cls in classes for f in dataclasses.fields(cls) if "env" in f.metadata
    }


def _secret_file(dep: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) that the file ``path`` of ``dep``'s container is mounted from."""
    pod = dep["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in _container(dep)["volumeMounts"]}
    directory, name = path.rsplit("/", 1)
    volume = {v["name"]: v for v in pod["volumes"]}[mounts[directory]]
    return volume["secret"]["secretName"], name


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_the_rollout_controller_runs_alone_safely_and_as_its_own_user(overlay: str) -> None:
    docs = _render(overlay)
    dep = _by_name(docs, "Deployment")["rollout"]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # one writer at a time
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    c = _container(dep)
    env = _env(c)
    assert c["command"] == ["python", "-m", "learner_svc"]
    assert env["PODIUM_LEARNER_MODE"]["value"] == "rollout" and "rollout" in MODES
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert limits["cpu"] and limits["memory"] and requests["cpu"] and requests["memory"]
    # Probes on the health port, which is not the RolloutService port.
    health = int(env["PODIUM_HEALTH_PORT"]["value"])
    grpc_port = int(env["PODIUM_ROLLOUT_GRPC_PORT"]["value"])
    assert health != grpc_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == health, probe
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    metrics = int(env["PODIUM_METRICS_PORT"]["value"])
    assert ports == {"grpc": grpc_port, "health": health, "metrics": metrics}
    assert len({grpc_port, health, metrics}) == 3
    service = _by_name(docs, "Service")["rollout"]
    assert service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == port["targetPort"] == grpc_port

    # Its own Kafka principal, whose ACLs are the dev broker's "rollout" grants (and whose
    # groups and transactional ids must therefore start with "rollout").
    bus = KafkaConfig.from_url(env["PODIUM_BUS"]["value"], sasl_password="from-secret")
    assert bus.sasl_username == "rollout" and bus.security_protocol == "SASL_SSL"
    assert env["PODIUM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "rollout"
    assert "rollout" in _by_name(docs, "KafkaUser") and service_grants("rollout")
    for group in ("PODIUM_GROUP_ID", "PODIUM_ROLLOUT_GROUP"):
        assert env[group]["value"].startswith("rollout"), group
    # Candidates only from announcements signed by a trusted key, mounted from its Secret.
    trusted = env["PODIUM_POLICY_TRUSTED_KEYS"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[trusted]]["secret"]["secretName"] == TRUSTED_SECRET

    # Every PODIUM_* setting it is given is one the controller reads.
    read = _read_by(LearnerConfig, ControllerSettings) | {"PODIUM_KAFKA_SASL_PASSWORD"}
    given = {n for n in env if n.startswith("PODIUM_")}
    assert given <= read, given - read


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_grpc_tokens_and_tls_come_from_secrets(overlay: str) -> None:
    docs = _render(overlay)
    secrets = _secrets(docs)
    assert secrets[TLS_SECRET]["type"] == "kubernetes.io/tls"
    for name in (TOKENS_SECRET, TLS_SECRET):  # placeholders until an operator fills them
        assert all("REPLACE-ME" in v for v in secrets[name]["stringData"].values()), name
    deployments = _workloads(docs)
    for name, settings in (("orchestrator", OrchestratorConfig), ("rollout", ControllerSettings)):
        dep = deployments[name]
        env = _env(_container(dep))
        wanted = {
            "PODIUM_GRPC_TOKENS": TOKENS_SECRET,
            "PODIUM_GRPC_TLS_CERT": TLS_SECRET,
            "PODIUM_GRPC_TLS_KEY": TLS_SECRET,
        }
        assert set(wanted) <= _read_by(settings), name
        for var, secret in wanted.items():
            path = env[var]["value"]  # a file path, never the material itself
            assert path.startswith("/") and "valueFrom" not in env[var], (name, var)
            assert _secret_file(dep, path) in {
                (secret, key) for key in secrets[secret]["stringData"]
            }, (name, var)
        # Tokens without TLS would be refused: nothing turns that check off in a cluster.
        assert "PODIUM_GRPC_PLAINTEXT_TOKENS" not in env, name
    # The other workloads serve no authenticated gRPC: they get neither Secret.
    for name, dep in deployments.items():
        if name not in ("orchestrator", "rollout"):
            held = {
                v.get("secret", {}).get("secretName")
                for v in dep["spec"]["template"]["spec"]["volumes"]
            }
            assert not held & {TOKENS_SECRET, TLS_SECRET}, name


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_orchestrators_route_by_the_rollout_and_the_learner_follows_it(overlay: str) -> None:
    deployments = _workloads(_render(overlay))
    orchestrator = _env(_container(deployments["orchestrator"]))
    assert orchestrator["PODIUM_ROLLOUT"]["value"] == "controlled"
    assert "PODIUM_ROLLOUT" in _read_by(OrchestratorConfig)
    learner = _env(_container(deployments["learner"]))
    assert learner["PODIUM_LEARNER_ROLLOUT_TOPIC"]["value"] == topics.ROLLOUT
    assert "PODIUM_LEARNER_ROLLOUT_TOPIC" in _read_by(LoopSettings)
