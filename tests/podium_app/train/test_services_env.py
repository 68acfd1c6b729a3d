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
