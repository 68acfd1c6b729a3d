"""Rendered containers made local processes (podium_app.deploy.plan) and the static checks
(podium_app.deploy.checks): ports remapped consistently with probes, Service names and mount
paths rewritten, the variables read by code found by walking it."""

from __future__ import annotations

from pathlib import Path

from podium_app.deploy.checks import read_variables, unread_variables
from podium_app.deploy.manifest import Container, Mount, Probe
from podium_app.deploy.plan import (
    image_env,
    is_podium_image,
    localize,
    rewrite_hosts,
    rewrite_paths,
)


def _container(**kw: object) -> Container:
    base: dict[str, object] = {
        "pod": "svc-0",
        "workload": "svc",
        "name": "svc",
        "image": "podium",
        "argv": ("python", "-m", "svc"),
        "env": (),
        "env_names": (),
        "ports": {"health": 8081},
        "probes": (Probe("grpc", 8081),),
        "mounts": (),
    }
    base.update(kw)
    return Container(**base)  # type: ignore[arg-type]


def test_podium_image_names() -> None:
    assert is_podium_image("ghcr.io/podium-rl/podium:0.1.0")
    assert is_podium_image("podium")
    assert is_podium_image("registry:5000/podium@sha256:abc")
    assert not is_podium_image("nvcr.io/nvidia/tritonserver:24.08-py3")
    assert not is_podium_image("ghcr.io/podium-rl/podium-tools:1")


def test_ports_env_and_probe_agree_through_the_table(tmp_path: Path) -> None:
    env = (
        ("PODIUM_HEALTH_PORT", "8081"),
        ("PODIUM_GRPC_PORT", "50051"),
        ("PODIUM_MAX_OPEN", "8081"),
    )
    c = _container(env=env)
    local = localize(c, {8081: 40001, 50051: 40002}, {}, {}, {}, tmp_path)
    assert local.env["PODIUM_HEALTH_PORT"] == "40001"
    assert local.env["PODIUM_GRPC_PORT"] == "40002"
    assert local.env["PODIUM_MAX_OPEN"] == "8081"  # not a *_PORT setting: left as rendered
    assert local.probes == ((Probe("grpc", 8081), "127.0.0.1:40001"),)


def test_a_probe_on_another_port_goes_where_nothing_serves(tmp_path: Path) -> None:
    c = _container(
        env=(("PODIUM_HEALTH_PORT", "8081"),),
        probes=(Probe("grpc", 8081, which="liveness"), Probe("grpc", 8082)),
    )
    local = localize(c, {8081: 40001, 8082: 40003}, {}, {}, {}, tmp_path)
    assert local.env["PODIUM_HEALTH_PORT"] == "40001"
    assert [address for _, address in local.probes] == ["127.0.0.1:40001", "127.0.0.1:40003"]


def test_service_names_and_mount_paths_are_rewritten_once(tmp_path: Path) -> None:
    addresses = {
        (dns, 8001): "127.0.0.1:9" for dns in ("triton", "triton.podium.svc.cluster.local")
    }
    assert rewrite_hosts("v2://triton:8001", addresses) == "v2://127.0.0.1:9"
    assert (
        rewrite_hosts("v2://triton.podium.svc.cluster.local:8001/x", addresses)
        == "v2://127.0.0.1:9/x"
    )
    assert (
        rewrite_hosts("v2://triton:9999 mytriton:8001", addresses)
        == "v2://triton:9999 mytriton:8001"
    )
    mounts = [("/etc/podium/ca", tmp_path / "tmp" / "ca"), ("/tmp", tmp_path / "tmp")]
    url = "kafka://h:1?ssl_cafile=/etc/podium/ca/ca.crt&x=/tmp/a"
    assert (
        rewrite_paths(url, mounts)
        == f"kafka://h:1?ssl_cafile={tmp_path}/tmp/ca/ca.crt&x={tmp_path}/tmp/a"
    )
    assert rewrite_paths("/tmpfoo /etc/podium/cab", mounts) == "/tmpfoo /etc/podium/cab"


def test_process_env_is_the_image_env_then_the_rendered_one(tmp_path: Path) -> None:
    c = _container(env=(("PODIUM_LOG_LEVEL", "INFO"),), mounts=(Mount("tmp", "/tmp"),))
    local = localize(
        c, {8081: 40001}, {}, {"tmp": tmp_path / "v"}, {"PYTHONUNBUFFERED": "1"}, tmp_path
    )
    assert {k: v for k, v in local.env.items() if k not in ("PATH", "HOME", "PYTHONPATH")} == {
        "PYTHONUNBUFFERED": "1",
        "PODIUM_LOG_LEVEL": "INFO",
    }


def test_the_dockerfile_env_is_read() -> None:
    assert image_env()["PYTHONUNBUFFERED"] == "1"


def test_read_variables_are_found_in_the_code_not_a_list() -> None:
    known = read_variables()
    # Declared by env() in the library, a service, a namespace package (learner_svc/rollout),
    # read beside the Kafka URL, and declared by OpenTelemetry.
    for name in (
        "PODIUM_HEALTH_PORT",
        "PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX",
        "PODIUM_ROLLOUT_STAGES",
        "PODIUM_KAFKA_SASL_PASSWORD",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_SERVICE_NAME",
    ):
        assert name in known, name
    c = _container(env_names=("PODIUM_HEALTH_PORT", "PODIUM_SERVICE_NAME", "OTEL_SERVICE_NAME"))
    assert unread_variables([c], known) == [
        "svc-0/svc: PODIUM_SERVICE_NAME is set but read by no config (not an env() field of "
        "podium/ or a service, nor a standard OTEL_* variable)"
    ]
