"""Kafka topics as rendered (Strimzi KafkaTopic resources): exactly the topics of
podium/topics.py and their dead-letter topics, replication that acks=all can live with on the
brokers there are, partitions enough for every consumer group's replicas, and history kept
where the services read it from the beginning; transactional ids that do not depend on which
pod writes."""

from __future__ import annotations

from typing import Any

import pytest
from test_kustomize import OVERLAYS, _by_name, _container, _env, _render, _workloads

from podium import topics
from podium.bus import KafkaConfig, partition_transactional_id
from podium.bus.kafka import SASL_PASSWORD_ENV
from podium.config import from_env
from podium_app.kafka_auth import SERVICES, service_grants
from reward_svc.config import RewardServiceConfig

STATE_TOPICS = (topics.ROLLOUT, topics.REVIEWS, topics.ORCHESTRATOR_SESSIONS)
"""Keyed state the services read whole: compacted (one record per key is the state)."""


def _topics(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """KafkaTopic spec by Kafka topic name (``topicName``, else the object's name)."""
    out = {}
    for topic in _by_name(docs, "KafkaTopic").values():
        name = topic["spec"].get("topicName", topic["metadata"]["name"])
        assert topic["metadata"]["labels"]["strimzi.io/cluster"] == "podium-kafka", name
        out[name] = topic["spec"]
    return out


def _brokers(docs: list[dict[str, Any]]) -> int:
    return sum(
        pool["spec"]["replicas"]
        for pool in _by_name(docs, "KafkaNodePool").values()
        if "broker" in pool["spec"]["roles"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_declared_topics_are_the_code_topics_and_their_dead_letters(overlay: str) -> None:
    declared = set(_topics(_render(overlay)))
    consumed = {t for reads, _writes in SERVICES.values() for t in reads}
    wanted = set(topics.ALL) | {topics.ORCHESTRATOR_SESSIONS}
    wanted |= {topics.dead_letter(t) for t in consumed}
    assert declared == wanted, (sorted(declared - wanted), sorted(wanted - declared))
    # ...which are exactly the topics the KafkaUsers' ACLs name.
    granted = {g.prefix for s in SERVICES for g in service_grants(s) if g.resource == "TOPIC"}
    assert declared == granted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replication_fits_the_brokers_and_min_insync(overlay: str) -> None:
    """acks=all needs min.insync.replicas in-sync copies: a topic with fewer replicas than
    that refuses every publish (the issue's prod overlay did), and more replicas than
    brokers is never created."""
    docs = _render(overlay)
    brokers = _brokers(docs)
    (kafka,) = _by_name(docs, "Kafka").values()
    config = kafka["spec"]["kafka"]["config"]
    cluster_isr = config["min.insync.replicas"]
    for key in ("default.replication.factor", "offsets.topic.replication.factor"):
        assert cluster_isr <= config[key] <= brokers, key
    assert (
        config["transaction.state.log.min.isr"]
        <= config["transaction.state.log.replication.factor"]
        <= brokers
    )
    for name, spec in _topics(docs).items():
        isr = spec["config"].get("min.insync.replicas", cluster_isr)
        assert 1 <= isr <= spec["replicas"] <= brokers, name
        if brokers >= 3:
            # Production: a broker may be down (an upgrade) and publishes still succeed, and
            # an acknowledged record is on two brokers.
            assert spec["replicas"] >= 3 and 2 <= isr <= spec["replicas"] - 1, name


def _group_replicas(docs: list[dict[str, Any]], workload: str) -> int:
    """Most pods of ``workload`` at once: its HPA's maximum, else its replica count."""
    hpas = [
        h
        for h in _by_name(docs, "HorizontalPodAutoscaler").values()
        if h["spec"]["scaleTargetRef"]["name"] == workload
    ]
    if hpas:
        return max(int(h["spec"]["maxReplicas"]) for h in hpas)
    return int(_workloads(docs)[workload]["spec"].get("replicas", 1))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_partitions_cover_the_replicas_of_every_shared_consumer_group(overlay: str) -> None:
    """A member beyond a topic's partitions owns none and idles: every workload whose
    replicas share one consumer group needs at least as many partitions as replicas."""
    docs = _render(overlay)
    declared = _topics(docs)
    shared_groups = {  # workload -> the topic its replicas split between them
        "orchestrator": topics.TASKS,  # sessions are owned by tasks partition
        "subagent": topics.SUBTASKS_ASSIGNED,
        "reward": topics.TRAJECTORIES,
        "learner": topics.SCORED_TRAJECTORIES,
        "rollout": topics.SCORED_TRAJECTORIES,
    }
    for workload, topic in shared_groups.items():
        replicas = _group_replicas(docs, workload)
        assert declared[topic]["partitions"] >= replicas, (workload, topic, replicas)
    # Single writers: the learner and the rollout controller are one pod each by design.
    assert _group_replicas(docs, "learner") == _group_replicas(docs, "rollout") == 1
    # The ledger is read per tasks partition on take-over: as many partitions as tasks.
    assert (
        declared[topics.ORCHESTRATOR_SESSIONS]["partitions"] >= declared[topics.TASKS]["partitions"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_history_is_kept_where_services_read_from_the_beginning(overlay: str) -> None:
    declared = _topics(_render(overlay))
    # Every orchestrator replica loads the announced versions from the topic's beginning, the
    # rollout's candidates and the learner's reset come from it: never deleted by age, and
    # one partition so versions stay in order.
    updates = declared[topics.POLICY_UPDATES]
    assert int(updates["config"]["retention.ms"]) == -1
    assert updates["partitions"] == 1
    for name in STATE_TOPICS:
        config = declared[name]["config"]
        assert config["cleanup.policy"] == "compact", name
        assert "delete" not in config["cleanup.policy"], name
    # The rollout registry is one partition, as the controller creates it when absent.
    assert declared[topics.ROLLOUT]["partitions"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topic_settings_the_services_use_match_the_declared_topics(overlay: str) -> None:
    """Where a manifest names a topic or group, it is a declared topic and the group the
    autoscaler watches."""
    docs = _render(overlay)
    declared = _topics(docs)
    workloads = _workloads(docs)
    learner = _env(_container(workloads["learner"]))
    assert learner["PODIUM_LEARNER_ROLLOUT_TOPIC"] in declared
    for env in (_env(_container(w)) for w in workloads.values()):
        for key, value in env.items():
            if key.endswith("_TOPIC"):
                assert value in declared, (key, value)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_reward_replicas_share_stable_per_partition_transactional_ids(overlay: str) -> None:
    """reward_svc's transactional ids are ``<prefix>.<topic>.<partition>``: the prefix must
    be one literal shared by every replica (never the pod's name or any per-pod value), so
    the next owner of a partition fences the previous one, and it must be a prefix the
    reward KafkaUser may use."""
    docs = _render(overlay)
    reward = _workloads(docs)["reward"]
    entries = {e["name"]: e for e in _container(reward).get("env", [])}
    for name in ("PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX", "PODIUM_REWARD_GROUP", "PODIUM_INSTANCE"):
        entry = entries.get(name, {})
        assert "valueFrom" not in entry and "$(" not in entry.get("value", ""), name
    env = {n: e["value"] for n, e in entries.items() if "value" in e}
    config = from_env(RewardServiceConfig, environ={**env, SASL_PASSWORD_ENV: "from-secret"})
    assert config.transactional_id_prefix  # the same in every pod of one template
    txn = partition_transactional_id(config.transactional_id_prefix, config.in_topic, 0)
    allowed = [g.prefix for g in service_grants("reward") if g.resource == "TRANSACTIONAL_ID"]
    assert any(txn.startswith(p) for p in allowed), (txn, allowed)
    groups = [g.prefix for g in service_grants("reward") if g.resource == "GROUP"]
    assert any(config.group_id.startswith(p) for p in groups), (config.group_id, groups)


def _bus_urls(docs: list[dict[str, Any]]) -> dict[str, str]:
    """``PODIUM_BUS`` of every container of every pod template (workloads and Jobs)."""
    out = {}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if e["name"] == "PODIUM_BUS":
                    out[f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"] = e["value"]
    return out


def _floor_problems(docs: list[dict[str, Any]]) -> list[str]:
    """Bus URLs whose ``replication_factor`` (the floor of topics KafkaBus creates) is not the
    cluster's ``default.replication.factor``: below it, a topic a service creates before the
    Topic Operator would have fewer copies than acks=all needs."""
    (kafka,) = _by_name(docs, "Kafka").values()
    wanted = int(kafka["spec"]["kafka"]["config"]["default.replication.factor"])
    problems = []
    for where, url in _bus_urls(docs).items():
        floor = KafkaConfig.from_url(url, sasl_password="from-secret").replication_factor
        if floor != wanted:
            problems.append(f"{where}: replication_factor {floor}, the cluster's is {wanted}")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_bus_url_carries_the_clusters_replication_floor(overlay: str) -> None:
    docs = _render(overlay)
    assert len(_bus_urls(docs)) >= 5  # the five services (and the bootstrap Job)
    assert _floor_problems(docs) == []
    floors = {KafkaConfig.from_url(u).replication_factor for u in _bus_urls(docs).values()}
    assert floors == ({1} if overlay == "dev" else {3})
    assert max(floors) <= _brokers(docs)


def test_a_prod_bus_url_without_the_floor_fails() -> None:
    docs = _render("prod")
    orchestrator = _workloads(docs)["orchestrator"]
    for e in _container(orchestrator)["env"]:
        if e["name"] == "PODIUM_BUS":
            e["value"] = e["value"].replace("&replication_factor=3", "")
    assert _floor_problems(docs) == [
        "Deployment/orchestrator/orchestrator: replication_factor 1, the cluster's is 3"
    ]
