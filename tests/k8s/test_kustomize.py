"""The kustomize base and overlays render, and every workload follows the operating rules:
resource requests and limits, health probes on the port the service serves health on, a
metrics port Prometheus is told about, non-root, no privilege escalation, and no setting that
nothing reads. Also the shared helpers of tests/k8s (``_render`` and friends)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from learner_svc.algorithms.swarm import SwarmSettings
from learner_svc.config import LearnerConfig, LoopSettings
from learner_svc.rollout.config import ControllerSettings
from orchestrator_svc.config import OrchestratorConfig
from podium import telemetry
from podium.bus.kafka import SASL_PASSWORD_ENV
from podium.config import HEALTH_PORT_ENV, METRICS_PORT_ENV
from reward_svc.config import RewardServiceConfig
from subagent_svc.config import SubagentConfig

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PODIUM_CACHE", Path.home() / ".cache" / "podium"))
OVERLAYS = ("dev", "prod")
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
PODIUM_IMAGE = "ghcr.io/podium-rl/podium:"
HEALTH_PORT, METRICS_PORT = 8081, 9464

OTEL_READ = {
    "OTEL_SERVICE_NAME",  # the SDK's resource detector, merged over the code's name
    "OTEL_RESOURCE_ATTRIBUTES",
    telemetry.OTLP_ENDPOINT_ENV,
    telemetry.OTLP_TRACES_ENDPOINT_ENV,
    telemetry.TRACES_EXPORTER_ENV,
}
"""The standard OpenTelemetry variables the services honour (podium/telemetry.py)."""


def _kustomize() -> str:
    found = shutil.which("kustomize") or str(CACHE / "go-bin" / "kustomize")
    if not Path(found).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(
                "kustomize is missing: scripts/test.sh installs it under ~/.cache/podium/go-bin"
            )
        pytest.skip("kustomize not installed (scripts/test.sh installs it)")
    return found


@functools.cache
def _build(overlay: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [_kustomize(), "build", str(ROOT / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def _render(overlay: str) -> list[dict[str, Any]]:
    """Every object ``kustomize build k8s/overlays/<overlay>`` renders (a fresh copy)."""
    return copy.deepcopy(list(_build(overlay)))


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments and StatefulSets by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] in WORKLOAD_KINDS}


def _jobs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Jobs by name (the cold start, k8s/base/bootstrap.yaml)."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}


OPERATOR_SECRETS = ROOT / "k8s" / "components" / "operator-secrets" / "secrets.yaml"
"""The Secrets an operator makes by hand (placeholders): only the dev overlay renders them."""


@functools.cache
def _operator_secrets() -> dict[str, dict[str, Any]]:
    """The operator Secrets by name, as the component declares them (names, types, keys)."""
    docs = [d for d in yaml.safe_load_all(OPERATOR_SECRETS.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs}


def _secrets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Secrets a cluster holds for ``docs``: those rendered, and the operator's own (made
    by hand where the overlay leaves them out, with the component's names and keys)."""
    return {**copy.deepcopy(_operator_secrets()), **_by_name(docs, "Secret")}


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


def _podium_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers (not init containers) that run the project's image."""
    return [c for c in _pod(workload)["containers"] if c["image"].startswith(PODIUM_IMAGE)]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    """The container named like its workload."""
    (container,) = [
        c for c in _pod(workload)["containers"] if c["name"] == workload["metadata"]["name"]
    ]
    return dict(container)


def _env(container: dict[str, Any]) -> dict[str, str]:
    """Literal env values (secret references map to "")."""
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _mounts(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Mount path -> the volume (or claim template) mounted there, with ``readOnly``."""
    pod = _pod(workload)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for template in workload["spec"].get("volumeClaimTemplates", []):
        name = template["metadata"]["name"]
        volumes[name] = {"name": name, "claimTemplate": template}
    return {
        m["mountPath"]: {**volumes[m["name"]], "readOnly": m.get("readOnly", False)}
        for m in container.get("volumeMounts", [])
    }


def _claim(volume: dict[str, Any]) -> str | None:
    """The PersistentVolumeClaim a volume mounts (None for other volumes)."""
    claim = volume.get("persistentVolumeClaim", {}).get("claimName")
    return None if claim is None else str(claim)


def _read_by(*classes: type[Any]) -> set[str]:
    """The environment variables ``classes`` read."""
    return {
        f.metadata["env"] for cls in classes for f in dataclasses.fields(cls) if "env" in f.metadata
    }


def _settings_of(container: dict[str, Any]) -> tuple[type[Any], ...]:
    """The config classes the service in ``container`` reads, by its command and mode (the
    ``podium rollout bootstrap`` Job: its own, the learner's and the rollout client's)."""
    if container["command"][:3] == ["podium", "rollout", "bootstrap"]:
        from podium_app.bootstrap import BootstrapSettings
        from podium_app.commands.rollout import ClientConfig

        return (BootstrapSettings, SwarmSettings, ClientConfig)
    module = container["command"][-1]
    mode = _env(container).get("PODIUM_LEARNER_MODE", "stats")
    table: dict[str, tuple[type[Any], ...]] = {
        "orchestrator_svc": (OrchestratorConfig,),
        "subagent_svc": (SubagentConfig,),
        "reward_svc": (RewardServiceConfig,),
        "learner_svc": {
            "stats": (LearnerConfig,),
            "swarm": (LearnerConfig, LoopSettings, SwarmSettings),
            "rollout": (LearnerConfig, ControllerSettings),
        }[mode],
    }
    return table[module]


def _common_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """What a container gets from the ConfigMaps of its ``envFrom``."""
    maps = _by_name(docs, "ConfigMap")
    out: dict[str, str] = {}
    for source in container.get("envFrom", []):
        out.update(maps[source["configMapRef"]["name"]]["data"])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workloads_follow_operating_rules(overlay: str) -> None:
    docs = _render(overlay)
    workloads = _workloads(docs)
    assert {"orchestrator", "subagent", "reward", "learner", "rollout", "triton"} <= set(workloads)
    jobs = _jobs(docs)
    assert set(jobs) == {"bootstrap"}
    for name, workload in {**workloads, **jobs}.items():
        pod = _pod(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod["containers"] + pod.get("initContainers", []):
            where = f"{name}/{c['name']}"
            assert c["resources"]["limits"]["memory"], where
            assert c["resources"]["requests"]["cpu"], where
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        if name in jobs:
            # A Job's pod runs to completion, once: never restarted in place by the kubelet.
            assert pod["restartPolicy"] == "Never", name
            continue
        for c in pod["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, f"{name}/{c['name']}"
    assert all(d["metadata"].get("namespace") == "podium" for d in docs if d["kind"] != "Namespace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_podium_containers_probe_and_expose_the_ports_they_serve(overlay: str) -> None:
    """Probes ask grpc.health.v1 on the port the process serves it on (PODIUM_HEALTH_PORT),
    the metrics port is the one PODIUM_METRICS_PORT opens, and the scrape annotations name
    it: a probe or a scrape on a port nothing serves fails here, not in a cluster."""
    docs = _render(overlay)
    served = 0
    for name, workload in _workloads(docs).items():
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        for c in _podium_containers(workload):
            where = f"{name}/{c['name']}"
            env = {**_common_env(docs, c), **_env(c)}
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert int(env[HEALTH_PORT_ENV]) == ports["health"] == HEALTH_PORT, where
            assert int(env[METRICS_PORT_ENV]) == ports["metrics"] == METRICS_PORT, where
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in c:
                    assert c[probe]["grpc"]["port"] == ports["health"], (where, probe)
            assert annotations["prometheus.io/scrape"] == "true", where
            assert int(annotations["prometheus.io/port"]) == ports["metrics"], where
            assert annotations["prometheus.io/path"] == "/metrics", where
            served += 1
    assert served == 5  # orchestrator, subagent, reward, learner, rollout
    # Triton's own metrics port is annotated too.
    triton = _workloads(docs)["triton"]
    ports = {p["name"]: p["containerPort"] for p in _container(triton)["ports"]}
    assert (
        int(triton["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"])
        == (ports["metrics"])
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_setting_a_podium_container_gets_is_read_by_its_service(overlay: str) -> None:
    """A variable that no config of the service reads is a silent no-op in a cluster (the
    issue found PODIUM_SERVICE_NAME and a health port nothing read)."""
    docs = _render(overlay)
    for name, workload in {**_workloads(docs), **_jobs(docs)}.items():
        for c in _podium_containers(workload):
            read = _read_by(*_settings_of(c)) | OTEL_READ | {SASL_PASSWORD_ENV}
            given = set(_common_env(docs, c)) | {e["name"] for e in c.get("env", [])}
            assert given <= read, (name, sorted(given - read))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_podium_container_config_parses_from_its_rendered_env(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered values are valid: each service's configs build from exactly its env
    (paths of mounted Secrets replaced by files that exist here)."""
    from podium.config import from_env

    # PODIUM_BUS is checked with the process's own Kafka password (a pod has it from its
    # KafkaUser's Secret), so the check must not depend on whether this shell has a broker's.
    monkeypatch.setenv(SASL_PASSWORD_ENV, "from-secret")
    docs = _render(overlay)
    placeholder = tmp_path / "mounted"
    placeholder.mkdir()
    (placeholder / "file").write_text("x")
    for name, workload in {**_workloads(docs), **_jobs(docs)}.items():
        for c in _podium_containers(workload):
            env = {**_common_env(docs, c), **_env(c), SASL_PASSWORD_ENV: "from-secret"}
            for key, value in env.items():
                if value.startswith("/etc/podium/"):
                    is_file = "." in value.rsplit("/", 1)[1]
                    env[key] = str(placeholder / "file" if is_file else placeholder)
            for cls in _settings_of(c):
                from_env(cls, environ=env)  # raises ConfigError naming any bad value
            assert name


def test_overlays_differ_where_they_should() -> None:
    dev = {(d["kind"], d["metadata"]["name"]): d for d in _render("dev")}
    prod = {(d["kind"], d["metadata"]["name"]): d for d in _render("prod")}
    assert dev[("KafkaNodePool", "dual-role")]["spec"]["replicas"] == 1
    assert prod[("KafkaNodePool", "dual-role")]["spec"]["replicas"] == 3
    for name in ("orchestrator", "subagent", "reward"):
        assert dev[("Deployment", name)]["spec"]["replicas"] == 1, name
    assert prod[("HorizontalPodAutoscaler", "subagent")]["spec"]["minReplicas"] > 1
    assert prod[("Deployment", "orchestrator")]["spec"]["replicas"] > 1
    orch = prod[("Service", "orchestrator")]
    assert orch["spec"]["ports"][0]["port"] == 50051


def _secret_references(workload: dict[str, Any]) -> set[str]:
    """Every Secret a pod template mounts or reads a variable from."""
    pod = _pod(workload)
    names = {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
    for c in [*pod["containers"], *pod.get("initContainers", [])]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        names |= {f["secretRef"]["name"] for f in c.get("envFrom", []) if "secretRef" in f}
    return names


def test_operator_secrets_are_never_applied_to_a_cluster() -> None:
    """``kubectl apply -k k8s/overlays/prod`` must not overwrite the operator's real Secrets
    with placeholders: prod renders none of them (and no placeholder at all), dev renders
    every one, and whatever a prod pod needs is rendered, made by Strimzi, or one of them."""
    operator = _operator_secrets()
    assert {"podium-policy-signing-key", "podium-grpc-tls", "podium-bootstrap"} <= set(operator)
    for name, doc in operator.items():
        assert all("REPLACE-ME" in v for v in doc["stringData"].values()), name
    prod = _render("prod")
    assert not set(operator) & set(_by_name(prod, "Secret"))
    assert "REPLACE-ME" not in yaml.safe_dump_all(prod)
    dev = _by_name(_render("dev"), "Secret")
    for name, doc in operator.items():
        assert dev[name]["stringData"] == doc["stringData"], name
    strimzi = {f"{cluster}-cluster-ca-cert" for cluster in _by_name(prod, "Kafka")}
    strimzi |= set(_by_name(prod, "KafkaUser"))
    available = set(_by_name(prod, "Secret")) | set(operator) | strimzi
    pods = {**_workloads(prod), **_jobs(prod)}
    for name, workload in pods.items():
        assert _secret_references(workload) <= available, (name, _secret_references(workload))
    assert any(_secret_references(w) & set(operator) for w in pods.values())
