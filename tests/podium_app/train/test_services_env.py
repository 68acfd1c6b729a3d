"""The environment ``podium train --bus kafka://`` gives its service processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from podium.bus.kafka import SASL_PASSWORD_ENV
from podium_app.train.config import TrainConfig
from podium_app.train.services import ProcessServices

SECURE = (
    "kafka://127.0.0.1:9093?security_protocol=SASL_SSL&sasl_mechanism=SCRAM-SHA-512"
    "&sasl_username=admin&ssl_cafile=/tmp/ca.pem"
)


def test_service_processes_get_the_broker_password_and_no_other_podium_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a secured broker the processes must log in like the driver: the URL names the user,
    the password comes through the environment (never a URL). The caller's other PODIUM_*
    settings stay out, so a stray one cannot reconfigure a service."""
    monkeypatch.setenv(SASL_PASSWORD_ENV, "s3cret")
    monkeypatch.setenv("PODIUM_REWARD_MAX_BATCH", "7")
    config = TrainConfig(run_dir=tmp_path / "run", bus=SECURE)
    envs = ProcessServices(config, "t").environments(tmp_path / "init.safetensors", 8)
    for service in ("reward_svc", "learner_svc"):
        assert envs[service]["PODIUM_BUS"] == SECURE
        assert envs[service][SASL_PASSWORD_ENV] == "s3cret"
        assert "PODIUM_REWARD_MAX_BATCH" not in envs[service]


def test_the_learner_process_gets_the_runs_pool_file(tmp_path: Path) -> None:
    """``--pool FILE``: the learner reads the same pool (its layout for trajectories that name
    no agents, and the agents its starting policy was cloned on); the default pool is the
    learner's own default."""
    pool = tmp_path / "pool.yaml"
    config = TrainConfig(run_dir=tmp_path / "run", bus=SECURE, pool=pool)
    envs = ProcessServices(config, "t").environments(tmp_path / "init.safetensors", 8)
    assert envs["learner_svc"]["PODIUM_POOL_SPEC"] == str(pool.resolve())
    plain = TrainConfig(run_dir=tmp_path / "run", bus=SECURE)
    envs = ProcessServices(plain, "t").environments(tmp_path / "init.safetensors", 8)
    assert envs["learner_svc"].get("PODIUM_POOL_SPEC", "") == ""
