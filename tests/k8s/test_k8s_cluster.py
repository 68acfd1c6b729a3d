"""What surrounds the services, as rendered: NetworkPolicy (default deny, and exactly the
connections the loop needs, evaluated pod to pod), the TLS Ingress for IDE clients, the
sub-agent autoscaler on consumer lag, disruption budgets, and observability (the collector's
trace path, Jaeger in dev, the Grafana dashboard)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from test_kustomize import (
    OVERLAYS,
    _by_name,
    _container,
    _env,
    _jobs,
    _pod,
    _render,
    _secrets,
    _workloads,
)

from podium import metrics, topics

PODIUM_SERVICES = ("orchestrator", "subagent", "reward", "learner", "rollout")
KAFKA_CLIENTS = (*PODIUM_SERVICES, "bootstrap")
"""Whoever logs in to Kafka: the services and the cold-start Job (as the learner's user)."""
NAMESPACE = "podium"
KAFKA_BROKER = {"strimzi.io/cluster": "podium-kafka", "strimzi.io/kind": "Kafka"}
ENTITY_OPERATOR = {
    "strimzi.io/cluster": "podium-kafka",
    "strimzi.io/name": "podium-kafka-entity-operator",
}
Pod = tuple[str, dict[str, str], dict[str, str]]
"""(namespace, namespace labels, pod labels)."""

KUBE_DNS: Pod = (
    "kube-system",
    {"kubernetes.io/metadata.name": "kube-system"},
    {"k8s-app": "kube-dns"},
)
INGRESS_NGINX: Pod = ("ingress-nginx", {"kubernetes.io/metadata.name": "ingress-nginx"}, {})
PROMETHEUS: Pod = (
    "monitoring",
    {"kubernetes.io/metadata.name": "monitoring"},
    {"app.kubernetes.io/name": "prometheus"},
)
OUTSIDE: Pod = ("default", {"kubernetes.io/metadata.name": "default"}, {"app": "curious"})


def _here(labels: dict[str, str]) -> Pod:
    return (NAMESPACE, {"kubernetes.io/metadata.name": NAMESPACE}, labels)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict[str, Any], pod: Pod) -> bool:
    namespace, ns_labels, labels = pod
    if "ipBlock" in peer:
        return False  # no pod-to-pod traffic here goes by address
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], ns_labels):
            return False
    elif namespace != NAMESPACE:
        return False
    return _matches(peer.get("podSelector", {}), labels)


def _port_matches(rule: dict[str, Any], port: int, protocol: str) -> bool:
    ports = rule.get("ports")
    return not ports or any(
        p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports
    )


def _allowed(
    policies: list[dict[str, Any]],
    direction: str,
    subject: Pod,
    other: Pod,
    port: int,
    protocol: str,
) -> bool:
    """Whether ``subject``'s policies let traffic go to (Egress) or come from (Ingress)
    ``other`` on ``port``: not isolated in that direction, or some rule allows it."""
    if subject[0] != NAMESPACE:
        return True  # our policies govern our namespace only
    selecting = [
        p
        for p in policies
        if direction in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], subject[2])
    ]
    if not selecting:
        return True
    key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peers = rule.get(peers_key)
            if (not peers or any(_peer_matches(p, other) for p in peers)) and _port_matches(
                rule, port, protocol
            ):
                return True
    return False


def _connects(
    policies: list[dict[str, Any]], source: Pod, dest: Pod, port: int, protocol: str = "TCP"
) -> bool:
    return _allowed(policies, "Egress", source, dest, port, protocol) and _allowed(
        policies, "Ingress", dest, source, port, protocol
    )


def _pods(docs: list[dict[str, Any]]) -> dict[str, Pod]:
    """The pods of every workload and Job, by its name."""
    return {
        name: _here(dict(w["spec"]["template"]["metadata"]["labels"]))
        for name, w in {**_workloads(docs), **_jobs(docs)}.items()
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_denies_by_default_and_allows_what_the_loop_needs(overlay: str) -> None:
    docs = _render(overlay)
    policies = list(_by_name(docs, "NetworkPolicy").values())
    deny = _by_name(docs, "NetworkPolicy")["default-deny"]["spec"]
    assert deny["podSelector"] == {} and set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    pods = _pods(docs)
    broker = _here(KAFKA_BROKER)
    needed = [
        (pods["orchestrator"], pods["triton"], 8001),
        (INGRESS_NGINX, pods["orchestrator"], 50051),
        (pods["rollout"], pods["rollout"], 50061),  # `kubectl exec ... podium rollout`
        (pods["bootstrap"], pods["rollout"], 50061),  # the cold-start Job, as an operator
    ]
    for name in PODIUM_SERVICES:
        needed += [
            (pods[name], pods["otel-collector"], 4317),
            (PROMETHEUS, pods[name], 9464),
        ]
    needed.append((PROMETHEUS, pods["triton"], 8002))
    if "jaeger" in pods:
        needed.append((pods["otel-collector"], pods["jaeger"], 4317))
    for source, dest, port in needed:
        assert _connects(policies, source, dest, port), (source, dest, port)
    for name, pod in pods.items():
        assert _connects(policies, pod, KUBE_DNS, 53, "UDP"), name
    # Kafka pods' ingress is the policy Strimzi generates (the listener's peers, below);
    # ours is the egress side: the services to the listener, brokers and controllers to each
    # other, the entity operator to the brokers and the API server.
    for name in KAFKA_CLIENTS:
        assert _allowed(policies, "Egress", pods[name], broker, 9093, "TCP"), name
    assert _allowed(policies, "Egress", broker, broker, 9090, "TCP")
    assert _allowed(policies, "Egress", _here(ENTITY_OPERATOR), broker, 9091, "TCP")
    assert _allowed(policies, "Egress", _here(ENTITY_OPERATOR), ("", {}, {}), 443, "TCP")
    refused = [
        (pods["subagent"], pods["triton"], 8001),
        (pods["learner"], pods["triton"], 8001),
        (pods["reward"], pods["orchestrator"], 50051),
        (OUTSIDE, pods["orchestrator"], 50051),
        (INGRESS_NGINX, pods["rollout"], 50061),
        (INGRESS_NGINX, pods["triton"], 8001),
        (pods["triton"], broker, 9093),
        (pods["subagent"], pods["learner"], 9464),
        (pods["bootstrap"], pods["triton"], 8001),
        (pods["bootstrap"], pods["orchestrator"], 50051),
        (pods["orchestrator"], pods["rollout"], 50061),
    ]
    for source, dest, port in refused:
        assert not _connects(policies, source, dest, port), (source, dest, port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kafka_listener_admits_the_podium_services_only(overlay: str) -> None:
    """Strimzi generates the brokers' ingress policy from the listener's peers: the services
    and the cold-start Job, nothing else."""
    docs = _render(overlay)
    (kafka,) = _by_name(docs, "Kafka").values()
    pods = _pods(docs)
    for listener in kafka["spec"]["kafka"]["listeners"]:
        peers = listener["networkPolicyPeers"]
        for name in KAFKA_CLIENTS:
            assert any(_peer_matches(p, pods[name]) for p in peers), (listener["name"], name)
        for name in set(pods) - set(KAFKA_CLIENTS):
            assert not any(_peer_matches(p, pods[name]) for p in peers), (listener["name"], name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingress_carries_grpc_over_tls_to_the_orchestrator(overlay: str) -> None:
    docs = _render(overlay)
    (ingress,) = _by_name(docs, "Ingress").values()
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    hosts = {rule["host"] for rule in spec["rules"]}
    tls_hosts = {h for entry in spec["tls"] for h in entry["hosts"]}
    assert hosts <= tls_hosts, "a host served without TLS"
    secrets = _secrets(docs)
    for entry in spec["tls"]:
        assert secrets[entry["secretName"]]["type"] == "kubernetes.io/tls"
    orchestrator = _workloads(docs)["orchestrator"]
    tls_backend = "PODIUM_GRPC_TLS_CERT" in _env(_container(orchestrator))
    annotations = ingress["metadata"]["annotations"]
    # The orchestrator serves TLS (tokens never travel in clear): nginx must speak gRPC over
    # TLS to it, or every call fails.
    assert annotations["nginx.ingress.kubernetes.io/backend-protocol"] == (
        "GRPCS" if tls_backend else "GRPC"
    )
    services = _by_name(docs, "Service")
    for rule in spec["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            service = services[backend["name"]]
            (port,) = [p for p in service["spec"]["ports"] if p["name"] == backend["port"]["name"]]
            assert service["spec"]["selector"] == orchestrator["spec"]["selector"]["matchLabels"]
            assert port["targetPort"] == int(_env(_container(orchestrator))["PODIUM_GRPC_PORT"])


def test_subagent_workers_scale_on_their_groups_consumer_lag() -> None:
    docs = _render("prod")
    (hpa,) = _by_name(docs, "HorizontalPodAutoscaler").values()
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "subagent")
    workload = _workloads(docs)["subagent"]
    assert "replicas" not in workload["spec"]  # the HPA owns the count
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    external = metric["external"]
    assert external["metric"]["name"] == "podium_consumer_lag"
    assert external["metric"]["name"] in metrics.METRIC_NAMES
    selector = external["metric"]["selector"]["matchLabels"]
    assert selector["group"] == _env(_container(workload))["PODIUM_GROUP_ID"]
    assert selector["topic"] == topics.SUBTASKS_ASSIGNED
    # Per-worker target: the adapter sums the members' shares (prometheus-adapter-values.yaml).
    assert external["target"]["type"] == "AverageValue"
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert _by_name(_render("dev"), "HorizontalPodAutoscaler") == {}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicated_workloads_have_disruption_budgets_that_allow_drains(overlay: str) -> None:
    docs = _render(overlay)
    budgets = list(_by_name(docs, "PodDisruptionBudget").values())
    hpas = {
        h["spec"]["scaleTargetRef"]["name"]: h
        for h in _by_name(docs, "HorizontalPodAutoscaler").values()
    }
    for name, workload in _workloads(docs).items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        mine = [b for b in budgets if _matches(b["spec"]["selector"], labels)]
        most = (
            hpas[name]["spec"]["maxReplicas"]
            if name in hpas
            else workload["spec"].get("replicas", 1)
        )
        if name in ("orchestrator", "subagent", "reward"):
            assert len(mine) == 1, name
        elif most == 1:
            assert not mine, f"{name}: a budget on a singleton only blocks drains"
        for budget in mine:
            spec = budget["spec"]
            # Never a budget that forbids every eviction.
            if "maxUnavailable" in spec:
                assert int(spec["maxUnavailable"]) >= 1, name
            else:
                assert int(spec["minAvailable"]) < most, name


def _collector_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(
        yaml.safe_load(_by_name(docs, "ConfigMap")["otel-collector"]["data"]["config.yaml"])
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_spans_reach_the_collector_and_in_dev_jaeger(overlay: str) -> None:
    docs = _render(overlay)
    services = _by_name(docs, "Service")
    config = _collector_config(docs)
    receiver_port = int(
        config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]
    )
    collector = services["otel-collector"]
    common = next(
        c
        for c in _by_name(docs, "ConfigMap").values()
        if "OTEL_EXPORTER_OTLP_ENDPOINT" in c.get("data", {})
    )
    host, port = common["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"].split("//", 1)[1].split(":")
    assert host == "otel-collector"
    (svc_port,) = [p for p in collector["spec"]["ports"] if p["port"] == int(port)]
    assert svc_port["targetPort"] == receiver_port
    traces = config["service"]["pipelines"]["traces"]["exporters"]
    if overlay != "dev":
        return
    # Dev: traces go to Jaeger all-in-one's OTLP port through its Service.
    (exporter,) = [e for e in traces if e.startswith("otlp")]
    host, port = config["exporters"][exporter]["endpoint"].split(":")
    jaeger_svc = services[host]
    (jport,) = [p for p in jaeger_svc["spec"]["ports"] if p["port"] == int(port)]
    jaeger = _workloads(docs)[host]
    assert jaeger_svc["spec"]["selector"] == jaeger["spec"]["selector"]["matchLabels"]
    container_ports = {p["name"]: p["containerPort"] for p in _container(jaeger)["ports"]}
    assert container_ports[jport["targetPort"]] == 4317
    assert _container(jaeger)["image"].startswith("jaegertracing/all-in-one:")
    assert _pod(jaeger)["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grafana_dashboard_ships_as_a_configmap_the_sidecar_loads(overlay: str) -> None:
    docs = _render(overlay)
    dashboard = _by_name(docs, "ConfigMap")["podium-grafana-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = dashboard["data"].values()
    assert isinstance(json.loads(text), dict)
