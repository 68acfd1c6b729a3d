"""Rendered objects read as the kubelet reads them (podium_app.deploy.manifest): env from
ConfigMaps, Secrets and fields, ``$(VAR)`` expansion, probes, pods and claim templates."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from podium.errors import ConfigError
from podium_app.deploy.manifest import Objects, Probe, expand, pods, services


def _workload(kind: str = "Deployment", replicas: int = 1, **container: Any) -> dict[str, Any]:
    spec = {"name": "app", "image": "ghcr.io/x/podium:1", "command": ["python", "-m", "svc"]}
    spec.update(container)
    return {
        "kind": kind,
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "replicas": replicas,
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [spec]}},
        },
    }


OBJECTS = [
    {"kind": "ConfigMap", "metadata": {"name": "common"}, "data": {"A": "1", "B": "from-map"}},
    {
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"password": base64.b64encode(b"s3cret").decode()},
        "stringData": {"user": "svc"},
    },
]


def test_env_order_value_from_and_field_refs() -> None:
    env = [
        {"name": "B", "value": "explicit"},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "USER", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
        {"name": "ONE", "valueFrom": {"configMapKeyRef": {"name": "common", "key": "A"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "ID", "value": "$(POD).$(NS) $$(POD) $(UNDEFINED)"},
        {
            "name": "OPT",
            "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
        },
    ]
    w = _workload(
        "StatefulSet", 2, envFrom=[{"configMapRef": {"name": "common"}, "prefix": "P_"}], env=env
    )
    pod = pods(Objects.of([*OBJECTS, w]))[1]
    c = pod.containers[0]
    assert pod.name == "web-1" and c.where == "web-1/app"
    assert c.env_dict() == {
        "P_A": "1",
        "P_B": "from-map",
        "B": "explicit",
        "PASSWORD": "s3cret",
        "USER": "svc",
        "ONE": "1",
        "POD": "web-1",
        "NS": "ns",
        "ID": "web-1.ns $(POD) $(UNDEFINED)",
    }
    assert "OPT" not in c.env_names  # an absent optional reference sets nothing


def test_missing_secret_key_names_the_container() -> None:
    env = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "absent"}}}]
    with pytest.raises(ConfigError, match=r"web-0/app X: Secret 'creds' has no key 'absent'"):
        pods(Objects.of([*OBJECTS, _workload(env=env)]))


def test_unsupported_field_ref_is_refused() -> None:
    env = [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}}]
    with pytest.raises(ConfigError, match=r"unsupported fieldRef 'spec\.serviceAccountName'"):
        pods(Objects.of([_workload(env=env)]))


def test_probe_ports_resolve_names_and_refuse_undeclared_ones() -> None:
    ports = [{"name": "health", "containerPort": 8081}]
    ok = _workload(ports=ports, readinessProbe={"grpc": {"port": "health"}})
    assert pods(Objects.of([ok]))[0].containers[0].readiness == Probe("grpc", 8081)
    http = _workload(readinessProbe={"httpGet": {"path": "/ready", "port": 8000}})
    assert pods(Objects.of([http]))[0].containers[0].readiness == Probe("http", 8000, "/ready")
    bad = _workload(ports=ports, readinessProbe={"grpc": {"port": "metrics"}})
    with pytest.raises(ConfigError, match="readiness probe port 'metrics' is not a declared port"):
        pods(Objects.of([bad]))


def test_claim_templates_become_per_pod_claims_and_services_have_dns_names() -> None:
    w = _workload("StatefulSet", 2)
    w["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "state"}}]
    second = pods(Objects.of([w]))[1]
    assert second.volumes["state"] == {
        "name": "state",
        "persistentVolumeClaim": {"claimName": "state-web-1"},
    }
    svc = {
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "selector": {"app": "web"},
            "ports": [{"name": "grpc", "port": 80, "targetPort": "grpc"}],
        },
    }
    (found,) = services(Objects.of([svc]))
    assert found.dns_names() == ("web", "web.ns", "web.ns.svc", "web.ns.svc.cluster.local")
    assert found.ports[0].target == "grpc"


def test_expand_is_kubernetes_expansion() -> None:
    assert expand("$(A)-$(B)-$$(A)", {"A": "x"}) == "x-$(B)-$(A)"
