"""Kafka security in k8s/, as rendered by kustomize: no plaintext listener, SCRAM over TLS, ACL
authorization, one KafkaUser per service with exactly the dev broker's ACLs, and every
service connecting as its own user with the password from that user's Secret."""

from __future__ import annotations

from typing import Any

import pytest
from test_kustomize import _render, _workloads

from podium.bus import KafkaConfig
from podium_app.kafka_auth import SERVICES, service_grants

STRIMZI_TYPES = {"topic": "TOPIC", "group": "GROUP", "transactionalId": "TRANSACTIONAL_ID"}


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_listener_is_tls_with_scram_and_acls_are_enforced(overlay: str) -> None:
    (kafka,) = _by_kind(_render(overlay), "Kafka").values()
    listeners = kafka["spec"]["kafka"]["listeners"]
    assert listeners, "no listener"
    for listener in listeners:
        assert listener["tls"] is True, listener
        assert listener["authentication"]["type"] == "scram-sha-512", listener
    assert kafka["spec"]["kafka"]["authorization"]["type"] == "simple"
    assert "userOperator" in kafka["spec"]["entityOperator"]


def test_each_service_user_has_exactly_the_dev_brokers_acls() -> None:
    users = _by_kind(_render("prod"), "KafkaUser")
    assert set(users) == set(SERVICES)
    for name, user in users.items():
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == "podium-kafka"
        assert user["spec"]["authentication"]["type"] == "scram-sha-512"
        assert user["spec"]["authorization"]["type"] == "simple"
        granted = set()
        for acl in user["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            assert resource["patternType"] == "prefix", acl
            assert acl.get("type", "allow") == "allow", acl
            for op in acl["operations"]:
                granted.add((STRIMZI_TYPES[resource["type"]], resource["name"], op.upper()))
        wanted = {(g.resource, g.prefix, g.operation) for g in service_grants(name)}
        assert granted == wanted, name


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_each_service_logs_in_as_its_own_user_over_tls(overlay: str) -> None:
    docs = _render(overlay)
    workloads = _workloads(docs)  # the learner is a StatefulSet
    for service in SERVICES:
        pod = workloads[service]["spec"]["template"]["spec"]
        (container,) = [c for c in pod["containers"] if c["name"] == service]
        env = {e["name"]: e for e in container["env"]}
        config = KafkaConfig.from_url(env["PODIUM_BUS"]["value"], sasl_password="from-secret")
        assert config.security_protocol == "SASL_SSL", service
        assert config.sasl_mechanism == "SCRAM-SHA-512" and config.sasl_username == service
        assert config.bootstrap_servers.endswith(":9093"), service
        secret = env["PODIUM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": service, "key": "password"}  # the KafkaUser's own Secret
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        ca_dir, ca_file = config.ssl_cafile.rsplit("/", 1)
        volume = {v["name"]: v for v in pod["volumes"]}[mounts[ca_dir]]
        assert volume["secret"]["secretName"] == "podium-kafka-cluster-ca-cert", service
        assert {"key": "ca.crt", "path": ca_file} in volume["secret"]["items"], service
    common = _by_kind(docs, "ConfigMap")
    for name, cm in common.items():
        assert "PODIUM_BUS" not in cm.get("data", {}), f"{name} still sets a shared PODIUM_BUS"
