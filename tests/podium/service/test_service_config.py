"""Service configuration from the environment: fail fast, naming the variable."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest

from learner_svc.config import LearnerConfig
from orchestrator_svc.config import OrchestratorConfig
from podium.config import HealthConfig, ServiceConfig, env, env_var, from_env, parse_bus_url
from podium.errors import ConfigError
from subagent_svc.config import SubagentConfig

ROOT = Path(__file__).resolve().parents[3]

KAFKA = {"PODIUM_BUS": "kafka://127.0.0.1:9092"}


@pytest.mark.parametrize("cls", [OrchestratorConfig, SubagentConfig, LearnerConfig])
def test_missing_bus_names_the_variable(cls: type[ServiceConfig]) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(cls, {})
    assert "PODIUM_BUS is required" in str(info.value)


def test_inproc_bus_is_rejected_for_a_standalone_process() -> None:
    with pytest.raises(ConfigError) as info:
        from_env(SubagentConfig, {"PODIUM_BUS": "inproc://"})
    message = str(info.value)
    assert "PODIUM_BUS='inproc://'" in message
    assert "kafka://" in message


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis://x:1", "expected kafka://"),
        ("kafka://", "no broker address"),
        ("kafka://host", "is not HOST:PORT"),
        ("kafka://host:99999", "is not HOST:PORT"),
        ("kafka://host:9092?no_such_option=1", "no_such_option"),
    ],
)
def test_invalid_bus_url_names_value_and_problem(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(SubagentConfig, {"PODIUM_BUS": url})
    assert f"PODIUM_BUS={url!r}" in str(info.value)
    assert fragment in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    environ = {"PODIUM_GRPC_PORT": "http", "PODIUM_MAX_SESSIONS": "0", "PODIUM_LOG_LEVEL": "loud"}
    with pytest.raises(ConfigError) as info:
        from_env(OrchestratorConfig, environ)
    message = str(info.value)
    for fragment in (
        "PODIUM_BUS is required",
        "PODIUM_GRPC_PORT='http' is invalid",
        "PODIUM_MAX_SESSIONS='0' is invalid: expected an integer > 0",
        "PODIUM_LOG_LEVEL='loud' is invalid",
    ):
        assert fragment in message


def test_values_are_converted_and_defaults_apply() -> None:
    cfg = from_env(
        OrchestratorConfig,
        {**KAFKA, "PODIUM_GRPC_PORT": "6000", "PODIUM_SESSION_TIMEOUT_S": "2.5"},
    )
    assert cfg.grpc_port == 6000
    assert cfg.session_timeout_s == 2.5
    assert cfg.max_sessions == 64  # default
    assert cfg.bus_url == "kafka://127.0.0.1:9092"
    with pytest.raises(FrozenInstanceError):
        cfg.grpc_port = 1  # type: ignore[misc]


def test_subagent_time_scale_rejects_negative() -> None:
    with pytest.raises(ConfigError, match=r"PODIUM_SUBAGENT_TIME_SCALE='-1' is invalid"):
        from_env(SubagentConfig, {**KAFKA, "PODIUM_SUBAGENT_TIME_SCALE": "-1"})


def test_required_field_left_out_of_the_constructor_is_named() -> None:
    with pytest.raises(ConfigError, match="PODIUM_BUS"):
        SubagentConfig()


def test_generic_helper_converts_annotated_types() -> None:
    @dataclass(frozen=True)
    class Demo:
        flag: bool = env("X_FLAG", default=False)
        """A flag."""
        names: tuple[str, ...] = env("X_NAMES", default=())
        """Names."""
        ratio: float | None = env("X_RATIO", default=None)
        """Ratio."""

    cfg = from_env(Demo, {"X_FLAG": "yes", "X_NAMES": "a, b,,c", "X_RATIO": "0.5"})
    assert cfg == Demo(flag=True, names=("a", "b", "c"), ratio=0.5)
    with pytest.raises(ConfigError, match=r"X_FLAG='maybe' is invalid: expected a boolean"):
        from_env(Demo, {"X_FLAG": "maybe"})
    assert env_var(Demo, "names") == "X_NAMES"


def test_parse_bus_url_accepts_broker_lists() -> None:
    url = "kafka://a:9092,b:9093"
    assert parse_bus_url(url) == url


@pytest.mark.parametrize("module", ["orchestrator_svc", "subagent_svc", "learner_svc"])
def test_entrypoint_exits_2_naming_the_missing_variable(module: str) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
    environ["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", module],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "PODIUM_BUS is required" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_docs_list_every_setting() -> None:
    text = (ROOT / "docs" / "services.md").read_text()
    for cls in (OrchestratorConfig, SubagentConfig, LearnerConfig):
        for f in dataclasses.fields(cls):
            assert f"`{f.metadata['env']}`" in text, f"{f.metadata['env']} missing from docs"


SERVICE_CONFIGS = [OrchestratorConfig, SubagentConfig, LearnerConfig]


@pytest.mark.parametrize("cls", SERVICE_CONFIGS)
def test_shared_settings_come_from_the_base_only(cls: type[ServiceConfig]) -> None:
    """Bus, instance, log level, partitions, shutdown timeout and health port are declared once,
    in ServiceConfig: a service field reading one of those variables would shadow it."""
    shared = {f.metadata["env"] for f in dataclasses.fields(ServiceConfig)}
    assert {"PODIUM_BUS", "PODIUM_HEALTH_PORT", "PODIUM_SHUTDOWN_TIMEOUT_S"} <= shared
    base_fields = {f.name for f in dataclasses.fields(ServiceConfig)}
    own = [f for f in dataclasses.fields(cls) if f.name not in base_fields]
    assert not [f.metadata["env"] for f in own if f.metadata.get("env") in shared]
    assert issubclass(cls, HealthConfig)


@pytest.mark.parametrize("cls", SERVICE_CONFIGS)
def test_health_port_is_a_shared_setting(cls: type[ServiceConfig]) -> None:
    assert from_env(cls, KAFKA).health_port == 0  # default: any free port
    assert from_env(cls, {**KAFKA, "PODIUM_HEALTH_PORT": "8081"}).health_port == 8081
    with pytest.raises(ConfigError, match=r"PODIUM_HEALTH_PORT='70000' is invalid: expected a TCP"):
        from_env(cls, {**KAFKA, "PODIUM_HEALTH_PORT": "70000"})


@pytest.mark.parametrize("module", ["subagent_svc", "reward_svc"])
def test_a_taken_health_port_fails_the_process_before_it_connects(module: str) -> None:
    """The health server is bound before the bus connects: no broker is needed to see it fail
    (the broker address here has nobody behind it), and the message names the variable."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("PODIUM_")}
        environ.update(
            PYTHONPATH=str(ROOT), PODIUM_BUS="kafka://127.0.0.1:1", PODIUM_HEALTH_PORT=str(port)
        )
        proc = subprocess.run(
            [sys.executable, "-m", module],
            env=environ,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1, proc.stderr
    assert f"PODIUM_HEALTH_PORT={port}: cannot serve grpc.health.v1" in proc.stderr
    assert "Traceback" not in proc.stderr
