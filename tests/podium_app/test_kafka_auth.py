"""The dev broker's security table and its shell output, without a broker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from podium import topics
from podium_app.kafka_auth import AuthError, service_grants
from podium_app.kafka_broker import BrokerError, KafkaBroker, env_lines


def test_reward_may_read_trajectories_and_write_scores_only() -> None:
    grants = {(g.resource, g.prefix, g.operation) for g in service_grants("reward")}
    assert ("TOPIC", topics.TRAJECTORIES, "READ") in grants
    assert ("TOPIC", topics.SCORED_TRAJECTORIES, "WRITE") in grants
    assert ("TOPIC", topics.dead_letter(topics.TRAJECTORIES), "WRITE") in grants
    assert ("TRANSACTIONAL_ID", "reward", "WRITE") in grants
    writable = {p for r, p, op in grants if r == "TOPIC" and op == "WRITE"}
    assert not any(p.startswith(topics.POLICY_UPDATES) for p in writable)
    assert not any(p.startswith(topics.TRAJECTORIES + ".v") for p in writable)
    assert {r for r, _, _ in grants} == {"TOPIC", "GROUP", "TRANSACTIONAL_ID"}  # no CLUSTER


def test_an_unknown_principal_is_named() -> None:
    with pytest.raises(AuthError, match="unknown service principal 'billing'"):
        service_grants("billing")


def test_env_lines_survive_eval_with_url_metacharacters() -> None:
    url = "kafka://127.0.0.1:1?security_protocol=SASL_SSL&sasl_username=admin&ssl_cafile=/a b"
    script = env_lines({"X_URL": url}, export=True) + 'printf %s "$X_URL"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == url


def test_a_bad_security_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="security must be one of sasl_ssl, plaintext"):
        KafkaBroker(tmp_path / "b", security="tls")
