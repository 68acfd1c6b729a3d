"""The dev overlay as a local deployment: it comes up, runs the loop, and catches broken manifests.

``podium deploy local`` (:mod:`podium_app.deploy`) renders ``k8s/overlays/dev`` and runs every
Podium container with exactly its rendered command and env as a process, Strimzi's Kafka
stood in for by a real secured broker with the same principals (a fresh one per deployment:
the overlay's consumer groups and the standard topics are its own, as in a new cluster) and
Triton by the real KServe-V2 server of tests/conftest.py.

* The dev overlay passes the static check (every env var read by a config, transactional ids
  that fence), every readiness probe passes on its rendered port, the cold-start Job
  (``bootstrap``: a behaviour clone published with the learner's key and made live through
  RolloutService) completes, and the loop learns with no human step: sessions submitted
  through SessionService over TLS with an ordinary client's token (``user``, not ``trainer``)
  are sampled by the orchestrator's exploration share, the learner trains on them, and its
  version is announced, signed, and served by the V2 server. The Job applied again completes
  and changes nothing.
* The trace backend of the deployment: the overlay's Jaeger workload runs as the real Jaeger
  binary (``scripts/jaeger.sh``, built from the Go module proxy; under ``CI=true`` a missing
  binary fails the test), the collector's Service is its OTLP receiver, and one more session,
  submitted inside a client span of ``podium deploy``'s own, is found in Jaeger through its
  HTTP query API with spans of every service that reports into a session's trace
  (orchestrator, subagent, reward and the learner, by their rendered ``OTEL_SERVICE_NAME``:
  podium_app.deploy.cycle.SESSION_WORKLOADS): the gRPC SERVER spans with the standard ``rpc.*`` attributes, and Kafka producer and consumer
  spans.
* Mutations of the overlay, as kustomize patches, each fail with a message naming the
  container: an env var no config reads; reward replicas whose transactional-id prefix is the
  pod name (a partition moving between them is not fenced); the retired per-replica
  transactional id (the service refuses it: exit 2); a readiness probe and a liveness probe
  on ports nothing serves. Each caught mutation is printed (``-s``) for the closing note.

A system-level test (about two minutes): it runs with the system suites
(scripts/test.sh SYSTEM_SUITES).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from podium_app.deploy.cycle import TraceView
from podium_app.deploy.local import DeploymentError
from podium_app.deploy.manifest import Objects
from podium_app.deploy.plan import make_plan
from podium_app.deploy.render import render
from podium_app.deploy.run import LocalSettings, check_only, deploy_local
from podium_app.deploy.standins import BrokerAccess, V2Access, find_jaeger

OVERLAY = "dev"

UNREAD_VAR = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: subagent}
spec:
  template:
    spec:
      containers:
        - name: subagent
          env:
            - {name: PODIUM_SUBAGENT_TIMESCALE, value: "0.01"}
"""
"""A misspelt setting (the config reads PODIUM_SUBAGENT_TIME_SCALE)."""

PER_POD_PREFIX = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: reward}
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: reward
          env:
            - name: PODIUM_REWARD_TRANSACTIONAL_ID_PREFIX
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
"""
"""Two reward replicas, each with its own transactional-id prefix (its pod name)."""

RETIRED_ID = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: reward}
spec:
  template:
    spec:
      containers:
        - name: reward
          env:
            - {name: PODIUM_REWARD_TRANSACTIONAL_ID, value: reward_svc-0}
"""
"""The per-replica transactional id the issue found (every replica ``reward_svc-0``)."""

PROBE_PORT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: subagent}
spec:
  template:
    spec:
      containers:
        - name: subagent
          readinessProbe:
            grpc: {port: 8082}
"""
"""The sub-agent's readiness probe moved to a port no setting opens."""

LIVENESS_PORT = """
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: learner}
spec:
  template:
    spec:
      containers:
        - name: learner
          livenessProbe:
            grpc: {port: 9999}
"""
"""The learner's liveness probe on a port nothing serves (the kubelet would restart it forever)."""


def _patch(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _settings(work: Path, v2_grpc: str, v2_repository: Path, **kw: object) -> LocalSettings:
    v2 = V2Access(v2_grpc, os.environ.get("PODIUM_V2_HTTP", ""), v2_repository)
    return LocalSettings(overlay=OVERLAY, work_dir=work, v2=v2, **kw)  # type: ignore[arg-type]


def _jaeger() -> Path | None:
    """The Jaeger binary; under CI a missing one is a failure (scripts/test.sh installs it)."""
    binary = find_jaeger()
    if binary is None and os.environ.get("CI") == "true":
        pytest.fail("no Jaeger binary under CI: scripts/jaeger.sh installs it (scripts/test.sh)")
    return binary


def _check_trace(trace: TraceView) -> None:
    """Every service on a session's path, gRPC with the standard attributes, Kafka both ways."""
    by_service: dict[str, list[str]] = {}
    for span in trace.spans:
        by_service.setdefault(span.service, []).append(f"{span.kind} {span.name}")
    print(f"trace {trace.trace_id} in Jaeger: {len(trace.spans)} spans")
    for service, spans in sorted(by_service.items()):
        print(f"  {service}: {sorted(set(spans))}")
    assert {"orchestrator", "subagent", "reward", "learner", "podium-deploy"} <= trace.services
    server = {s.name: s for s in trace.spans if s.service == "orchestrator" and s.kind == "server"}
    submit = server["/podium.v1.SessionService/SubmitTask"]
    assert submit.tags["rpc.system"] == "grpc"
    assert submit.tags["rpc.service"] == "podium.v1.SessionService"
    assert submit.tags["rpc.method"] == "SubmitTask"
    assert "/podium.v1.SessionService/StreamSession" in server
    # The tool's own CLIENT spans of both calls reached Jaeger too (none lost at its shutdown).
    client = {s.name for s in trace.spans if s.service == "podium-deploy" and s.kind == "client"}
    assert {
        "/podium.v1.SessionService/SubmitTask",
        "/podium.v1.SessionService/StreamSession",
    } <= client, sorted(client)
    kafka = [s for s in trace.spans if s.kind in ("producer", "consumer")]
    assert all(s.tags.get("messaging.system") == "kafka" for s in kafka)
    kinds = {(s.service, s.kind) for s in kafka}
    # Each service passed the trace on through Kafka; each took it from Kafka but the
    # orchestrator (it took it from gRPC).
    for service in ("orchestrator", "subagent", "reward"):
        assert (service, "producer") in kinds, (service, sorted(kinds))
    for service in ("subagent", "reward", "learner"):
        assert (service, "consumer") in kinds, (service, sorted(kinds))


def _caught(what: str, problems: list[str]) -> None:
    print(f"\nMUTATION CAUGHT ({what}):")
    for p in problems:
        print(f"  - {p[:400]}")


@pytest.mark.kafka
@pytest.mark.serving
@pytest.mark.slow
async def test_dev_overlay_comes_up_and_learns(
    kafka_bootstrap: str, v2_grpc: str, v2_repository: Path, tmp_path: Path
) -> None:
    del kafka_bootstrap  # a broker is installed here; the deployment starts a fresh one
    jaeger = _jaeger()
    t0 = time.monotonic()
    lines: list[str] = []
    settings = _settings(
        tmp_path / "work", v2_grpc, v2_repository, cycle=True, ready_timeout_s=90.0, jaeger=jaeger
    )
    outcome = await deploy_local(settings, lines.append)
    print("\n" + "\n".join(lines))
    plan = outcome.plan
    assert plan is not None
    services = {c.container.workload for c in plan.containers}
    assert {"orchestrator", "subagent", "reward", "learner", "rollout"} <= services
    assert set(outcome.ready_s) == {c.where for c in plan.containers}
    # The cold start is the deployment's own Job, not a step of the test.
    assert set(outcome.jobs_s) == {"bootstrap-0/bootstrap"}
    cycle = outcome.cycle
    assert cycle is not None
    assert cycle.bootstrap_version >= 1
    assert cycle.published > cycle.bootstrap_version
    assert cycle.sessions >= settings.sessions and cycle.sessions % settings.sessions == 0
    assert any(
        "applied again: podium rollout bootstrap: none; learned version live: "
        f"{cycle.bootstrap_version}" in line
        for line in lines
    ), lines
    # Every service stopped gracefully on SIGTERM.
    assert all(code == 0 for code in outcome.exit_codes.values()), outcome.exit_codes
    print(
        f"local deployment of {OVERLAY}: {time.monotonic() - t0:.1f}s; cycle {dict(cycle.seconds)}"
    )
    if jaeger is None:
        pytest.skip("the trace in Jaeger not checked: no Jaeger binary (bash scripts/jaeger.sh)")
    assert "jaeger-0/jaeger" in outcome.ready_s  # its rendered readiness probe passed
    assert cycle.trace is not None
    _check_trace(cycle.trace)


def test_jaeger_runs_from_its_workload_and_takes_the_collectors_service(tmp_path: Path) -> None:
    """The plan (nothing started): the Jaeger workload's container is the binary on a
    generated config whose ports are those the Services and the probe resolve to; the
    collector is not run and its Service is Jaeger's OTLP receiver, where the services'
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` now points."""
    objects = Objects.of(render(OVERLAY, ()))
    ca = tmp_path / "ca.pem"
    ca.write_text("plan only\n")
    users = {str(u["metadata"]["name"]): "x" for u in objects.kind("KafkaUser")}
    broker = BrokerAccess("127.0.0.1:9093", ca, users)
    v2 = V2Access("127.0.0.1:8001", "127.0.0.1:8000", tmp_path / "models")
    binary = tmp_path / "jaeger"
    plan = make_plan(objects, tmp_path / "work", broker, v2, jaeger=binary)
    (backend,) = [c for c in plan.containers if not c.podium]
    assert backend.where == "jaeger-0/jaeger"
    assert backend.argv[0] == str(binary)
    config = Path(backend.argv[1].removeprefix("--config=")).read_text()
    assert plan.trace_otlp == plan.address("jaeger", 4317) == plan.address("otel-collector", 4317)
    assert plan.trace_query == plan.address("jaeger", 16686)
    probed = next(a for p, a in backend.probes if p.which == "readiness")
    for address in (plan.trace_otlp, plan.trace_query, probed):
        assert f"endpoint: {address}" in config, (address, config)
    assert "memory:" in config and "jaeger_storage_exporter" in config
    orchestrator = next(c for c in plan.containers if c.container.workload == "orchestrator")
    assert orchestrator.env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://{plan.trace_otlp}"
    assert {"jaeger", "otel-collector"}.isdisjoint(
        c.container.workload for c in plan.containers if c.podium
    )
    assert any(line.startswith("otel-collector: not run: its Service is") for line in plan.replaced)
    assert check_only(OVERLAY, (), tmp_path / "check") == []


def test_unread_env_var_fails_the_check(tmp_path: Path) -> None:
    problems = check_only(OVERLAY, (_patch(tmp_path, "unread", UNREAD_VAR),), tmp_path / "work")
    _caught("env var no config reads", problems)
    assert problems == [
        "subagent-0/subagent: PODIUM_SUBAGENT_TIMESCALE is set but read by no config (not an "
        "env() field of podium/ or a service, nor a standard OTEL_* variable)"
    ]


def test_per_pod_transactional_prefix_fails_the_check(tmp_path: Path) -> None:
    problems = check_only(OVERLAY, (_patch(tmp_path, "prefix", PER_POD_PREFIX),), tmp_path / "work")
    _caught("per-replica transactional ids", problems)
    assert len(problems) == 1
    assert problems[0].startswith("reward/reward: replicas use different consumer groups or")
    assert "reward-0: group 'reward_svc' ids reward-0.*" in problems[0]
    assert "reward-1: group 'reward_svc' ids reward-1.*" in problems[0]


def test_dev_overlay_passes_the_check(tmp_path: Path) -> None:
    assert check_only(OVERLAY, (), tmp_path / "work") == []


@pytest.mark.kafka
@pytest.mark.serving
@pytest.mark.slow
async def test_broken_probe_ports_and_retired_transactional_id_fail_readiness(
    kafka_bootstrap: str, v2_grpc: str, v2_repository: Path, tmp_path: Path
) -> None:
    del kafka_bootstrap
    patches = (
        _patch(tmp_path, "probe", PROBE_PORT),
        _patch(tmp_path, "liveness", LIVENESS_PORT),
        _patch(tmp_path, "retired", RETIRED_ID),
    )
    settings = _settings(
        tmp_path / "work", v2_grpc, v2_repository, patches=patches, ready_timeout_s=40.0
    )
    with pytest.raises(DeploymentError) as caught:
        await deploy_local(settings, lambda _line: None)
    err = caught.value
    _caught("probe ports nothing serves; retired transactional id", err.problems)
    assert err.stage == "readiness"
    by_container = {p.split(":", 1)[0]: p for p in err.problems}
    assert set(by_container) == {"subagent-0/subagent", "learner-0/learner", "reward-0/reward"}
    probe = by_container["subagent-0/subagent"]
    assert "never passed its probes: readiness probe grpc on port 8082" in probe
    liveness = by_container["learner-0/learner"]
    assert "never passed its probes: liveness probe grpc on port 9999" in liveness
    retired = by_container["reward-0/reward"]
    assert "exited with status 2" in retired and "PODIUM_REWARD_TRANSACTIONAL_ID" in retired
