"""``podium deploy local``: the whole sequence, for the CLI and the test.

render -> stand-ins (a broker: ``--kafka`` or a fresh local one; the V2 server: ``--v2-*`` or
``$PODIUM_V2_*``) -> topics declared as ``KafkaTopic`` created as the Topic Operator would
(partitions and config as rendered, one replica: one broker) -> plan -> static check ->
processes (Jobs beside the rest; the trace backend, when the Jaeger binary is found, first)
-> readiness -> Jobs completed (the cold start: the ``bootstrap`` Job) -> (``cycle``) one
learning cycle as a client, then one traced session found in the local Jaeger -> stop (unless
held).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from podium.bus import KafkaBus, KafkaConfig
from podium.bus.base import TopicSpec
from podium.errors import ConfigError, PodiumError
from podium.policy.signing import TrustedKeys
from podium_app.deploy import cycle
from podium_app.deploy.local import DeploymentError, LocalDeployment, check
from podium_app.deploy.manifest import Objects, name_of
from podium_app.deploy.plan import Plan, make_plan
from podium_app.deploy.render import render
from podium_app.deploy.standins import BrokerAccess, V2Access, find_jaeger
from podium_app.kafka_broker import KafkaBroker

Say = Callable[[str], None]


@dataclass(frozen=True)
class LocalSettings:
    """What ``podium deploy local`` is asked to do."""

    overlay: str
    work_dir: Path
    v2: V2Access
    patches: tuple[Path, ...] = ()
    kafka_url: str = ""
    """Admin URL of an existing secured broker (its directory is found from the URL's
    ``ssl_cafile``, ``<dir>/tls/ca.pem``, as ``scripts/kafka.sh`` lays it out); empty: a fresh
    broker in ``<work>/kafka``."""
    ready_timeout_s: float = 120.0
    jobs_timeout_s: float = 300.0
    """How long the Jobs (the cold start: a behaviour clone, then the rollout) may take."""
    cycle: bool = False
    sessions: int = 8
    cycle_timeout_s: float = 180.0
    hold_s: float = 0.0
    """Keep the deployment running this long after everything passed (``--hold``)."""
    jaeger: Path | None = None
    """The Jaeger binary run as the overlay's trace backend; None: ``$PODIUM_JAEGER`` or the
    one ``scripts/jaeger.sh`` installed (:func:`~podium_app.deploy.standins.find_jaeger`),
    and without one the trace backend is not run."""


@dataclass
class Outcome:
    """What a run saw, for the CLI's report and the test's assertions."""

    plan: Plan | None = None
    ready_s: dict[str, float] = field(default_factory=dict)
    jobs_s: dict[str, float] = field(default_factory=dict)
    """Seconds until each Job's container completed."""
    cycle: cycle.CycleResult | None = None
    exit_codes: dict[str, int] = field(default_factory=dict)


def broker_from_url(url: str) -> BrokerAccess:
    """The broker of an admin ``kafka://`` URL with its directory's credentials."""
    parts = urlsplit(url)
    cafile = dict(parse_qsl(parts.query)).get("ssl_cafile", "")
    broker_dir = Path(cafile).parent.parent if cafile else None
    if broker_dir is None or not (broker_dir / "credentials.json").exists():
        raise ConfigError(
            f"--kafka {url!r}: the broker's credentials are not found (expected a broker "
            "started by scripts/kafka.sh / podium kafka start, ssl_cafile=<dir>/tls/ca.pem)"
        )
    broker = KafkaBroker(broker_dir)
    return BrokerAccess(parts.netloc, broker.ca_file, broker.passwords())


@contextlib.asynccontextmanager
async def broker_for(
    settings: LocalSettings, say: Say
) -> AsyncIterator[tuple[BrokerAccess, KafkaConfig]]:
    """The broker (given, or fresh and stopped on exit) and the admin's connection to it."""
    if settings.kafka_url:
        access = broker_from_url(settings.kafka_url)
        admin = KafkaConfig.from_url(
            settings.kafka_url, sasl_password=access.passwords.get("admin")
        )
        yield access, admin
        return
    run_dir = settings.work_dir / "kafka"
    if (run_dir / "state.json").exists():
        await asyncio.to_thread(KafkaBroker(run_dir).stop)
    shutil.rmtree(run_dir, ignore_errors=True)
    broker = KafkaBroker(run_dir)
    say(f"starting a local secured Kafka broker in {run_dir}")
    try:
        await asyncio.to_thread(broker.start, 180.0)
        access = BrokerAccess(broker.bootstrap, broker.ca_file, broker.passwords())
        admin = KafkaConfig.from_url(broker.client_url(), sasl_password=access.passwords["admin"])
        yield access, admin
    finally:
        await asyncio.to_thread(broker.stop)


async def create_topics(objects: Objects, admin: KafkaConfig) -> list[str]:
    """The ``KafkaTopic`` resources created on the broker (one replica, as rendered else)."""
    specs = []
    for topic in objects.kind("KafkaTopic"):
        spec = topic.get("spec", {})
        config = {str(k): str(v) for k, v in (spec.get("config") or {}).items()}
        config["min.insync.replicas"] = "1"  # one broker
        specs.append(
            TopicSpec(
                str(spec.get("topicName") or name_of(topic)),
                int(spec.get("partitions", 1)),
                1,
                tuple(config.items()),
            )
        )
    if specs:
        bus = KafkaBus(admin)
        await bus.start()
        try:
            await bus.create_topics(specs)
        finally:
            await bus.stop()
    return [s.name for s in specs]


async def deploy_local(settings: LocalSettings, say: Say) -> Outcome:
    """Run the sequence of the module docstring; raises :class:`DeploymentError` naming what
    failed. The processes are stopped whatever happens."""
    outcome = Outcome()
    objects = Objects.of(render(settings.overlay, settings.patches))
    async with broker_for(settings, say) as (broker, admin):
        jaeger = settings.jaeger or find_jaeger()
        plan = make_plan(objects, settings.work_dir, broker, settings.v2, jaeger=jaeger)
        outcome.plan = plan
        for line in plan.replaced:
            say(f"stood in for: {line}")
        problems = check(plan)
        if problems:
            raise DeploymentError("check", problems)
        say(
            f"checked: {sum(c.podium for c in plan.containers)} containers and {len(plan.jobs)} job(s), every env "
            "var read, transactional ids fence"
        )
        created = await create_topics(plan.objects, admin)
        say(f"topics created from KafkaTopic resources: {len(created)}")
        deployment = LocalDeployment(plan)
        try:
            await deployment.start()
            outcome.ready_s = await deployment.wait_ready(settings.ready_timeout_s)
            for where, seconds in sorted(outcome.ready_s.items(), key=lambda kv: kv[1]):
                say(f"ready: {where} after {seconds:.1f}s")
            for line in service_lines(plan):
                say(line)
            outcome.jobs_s = await deployment.wait_jobs(settings.jobs_timeout_s)
            for where, seconds in sorted(outcome.jobs_s.items(), key=lambda kv: kv[1]):
                say(f"job completed: {where} after {seconds:.1f}s")
            if settings.cycle:
                outcome.cycle = await run_cycle(plan, deployment, admin, settings, say)
            if settings.hold_s:
                say(f"holding for {settings.hold_s:.0f}s (logs in {deployment.log_dir})")
                await asyncio.sleep(settings.hold_s)
        finally:
            outcome.exit_codes = await deployment.stop()
    return outcome


async def run_cycle(
    plan: Plan, deployment: LocalDeployment, admin: KafkaConfig, settings: LocalSettings, say: Say
) -> cycle.CycleResult:
    """The cold start's version served, then sessions as an ordinary client in rounds of
    ``settings.sessions`` until the learner announces a new version, which is served
    (:mod:`.cycle`)."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    deadline = t0 + settings.cycle_timeout_s
    rollout = plan.address("rollout", _grpc_port(plan, "rollout"))
    live = await cycle.live_version(plan, rollout, settings.cycle_timeout_s)
    if not live.isdigit():
        raise DeploymentError("cycle", [f"no learned version live after the Jobs: {live!r}"])
    await cycle.wait_served(settings.v2.grpc, int(live), settings.cycle_timeout_s)
    seconds["live_served"] = time.monotonic() - t0
    say(f"cold start: version {live} live (the bootstrap Job) and served")
    orchestrator = plan.address("orchestrator", _grpc_port(plan, "orchestrator"))
    assert plan.operator.policy_keys is not None
    trusted = TrustedKeys.load(str(plan.operator.policy_keys.public_path))
    submitted, published = 0, 0
    while not published:
        remaining = deadline - time.monotonic()
        results = await cycle.run_sessions(plan, orchestrator, settings.sessions, remaining)
        submitted += len(results)
        say(f"{submitted} sessions submitted as {cycle.CLIENT} (not trainer) and finished")
        wait = min(30.0, max(deadline - time.monotonic(), 1.0))
        try:
            published = await cycle.wait_published(admin, int(live), trusted, wait)
        except PodiumError:
            if time.monotonic() > deadline:
                raise
    seconds["published"] = time.monotonic() - t0
    say(f"learner: version {published} announced (PolicyUpdated, signed by the deployment key)")
    await cycle.wait_served(settings.v2.grpc, published, settings.cycle_timeout_s)
    seconds["served"] = time.monotonic() - t0
    say(f"V2 server: {published} ready")
    await rerun_jobs(plan, deployment, rollout, live, settings, say)
    seconds["jobs_again"] = time.monotonic() - t0
    trace = None
    if plan.trace_query:
        trace = await cycle.traced_session(plan, orchestrator, settings.cycle_timeout_s)
        seconds["trace"] = time.monotonic() - t0
        say(
            f"trace {trace.trace_id}: {len(trace.spans)} spans from "
            f"{', '.join(sorted(trace.services))} in Jaeger "
            f"(http://{plan.trace_query}/trace/{trace.trace_id})"
        )
    if deployment.exited():
        raise DeploymentError("cycle", [f"{w} exited {c}" for w, c in deployment.exited().items()])
    return cycle.CycleResult(int(live), submitted, published, seconds, trace)


async def rerun_jobs(
    plan: Plan,
    deployment: LocalDeployment,
    rollout: str,
    live: str,
    settings: LocalSettings,
    say: Say,
) -> None:
    """The Jobs applied again complete again and change nothing: the cold start is idempotent
    (the version live stays ``live``)."""
    await deployment.rerun_jobs()
    await deployment.wait_jobs(settings.jobs_timeout_s)
    for c in plan.jobs:
        last = deployment.log_tail(c, 400).strip().splitlines()[-1:]
        say(f"job {c.where} applied again: {last[0] if last else 'no output'}")
    again = await cycle.live_version(plan, rollout, settings.cycle_timeout_s)
    if again != live:
        raise DeploymentError(
            "jobs", [f"applied again, the Jobs moved live from {live} to {again}"]
        )


def service_lines(plan: Plan) -> list[str]:
    """Where each rendered Service port answers locally, and the clients' credentials."""
    lines = []
    for svc in plan.objects.kind("Service"):
        name = name_of(svc)
        for port in svc.get("spec", {}).get("ports", []):
            address = plan.addresses.get((name, int(port["port"])), "")
            lines.append(f"service {name}:{port['port']} ({port.get('name', '')}) -> {address}")
    tokens = ", ".join(f"{k}: {v}" for k, v in sorted(plan.operator.tokens.items()))
    lines.append(f"tokens: {tokens}; gRPC CA: {plan.operator.grpc_ca}")
    return lines


def _grpc_port(plan: Plan, service: str) -> int:
    """The Service's port named ``grpc`` (else its first)."""
    for svc in plan.objects.kind("Service"):
        if name_of(svc) == service:
            ports = svc.get("spec", {}).get("ports", [])
            named = [p for p in ports if p.get("name") == "grpc"] or ports
            if named:
                return int(named[0]["port"])
    raise ConfigError(f"the overlay has no Service {service!r}")


def check_only(overlay: str, patches: tuple[Path, ...], work_dir: Path) -> list[str]:
    """The static check alone, with placeholder broker credentials (nothing connects)."""
    objects = Objects.of(render(overlay, patches))
    ca = work_dir / "check-only-ca.pem"
    ca.parent.mkdir(parents=True, exist_ok=True)
    ca.write_text("check only: no broker\n")
    users = {name_of(u): "check-only" for u in objects.kind("KafkaUser")}
    broker = BrokerAccess("127.0.0.1:9093", ca, users)
    v2 = V2Access("127.0.0.1:8001", "127.0.0.1:8000", work_dir / "models")
    return check(make_plan(objects, work_dir, broker, v2))


def v2_from_env(grpc_address: str, http: str, repository: str) -> V2Access:
    """Flags, else ``$PODIUM_V2_GRPC``/``_HTTP``/``_REPOSITORY`` (scripts/v2server.sh)."""
    grpc_address = grpc_address or os.environ.get("PODIUM_V2_GRPC", "")
    http = http or os.environ.get("PODIUM_V2_HTTP", "")
    repository = repository or os.environ.get("PODIUM_V2_REPOSITORY", "")
    if not (grpc_address and repository):
        raise ConfigError(
            "no KServe-V2 server: pass --v2-grpc/--v2-http/--v2-repository or "
            'eval "$(scripts/v2server.sh start DIR)" first'
        )
    return V2Access(grpc_address, http, Path(repository))


def admin_url_from_env(url: str) -> str:
    """``--kafka``, else empty (a fresh broker); a bare ``host:port`` is refused: the
    deployment needs the broker's principals."""
    if url and not url.startswith("kafka://"):
        raise ConfigError(f"--kafka {url!r}: give the kafka:// URL scripts/kafka.sh start printed")
    return url


__all__ = [
    "LocalSettings",
    "Outcome",
    "broker_from_url",
    "check_only",
    "create_topics",
    "deploy_local",
    "run_cycle",
    "v2_from_env",
]
