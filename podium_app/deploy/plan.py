"""From rendered objects to local processes: ports, addresses, volumes, environments.

Pure planning plus the files a pod's volumes hold (:func:`materialize`); nothing is started
here. The rules, each applied the same way to every container (docs/operations.md):

* **Which containers run.** Every container and init container of a Deployment/StatefulSet/Job
  pod whose image is a Podium image (repository ``.../podium`` or ``podium``, any tag); a Job's
  containers run to completion (``Plan.jobs``). The rest are stood in for (:mod:`.standins`);
  the trace backend runs as the Jaeger binary when one is given (:func:`backend`: a container
  with ``podium`` false, which the static check skips, started first and stopped last).
* **Ports.** Pods share loopback, so each pod's ports are remapped to free local ports, one
  table per pod: every declared ``containerPort``, every probe's port, and the value of
  every variable named ``*_PORT`` that holds a port number (an image's ``ENV`` included) get a
  local port; the variable is rewritten to it and the probe is sent to it. A probe and a
  setting that agree in the manifest therefore agree locally; a probe on a port no setting
  opens is sent to a port nothing serves, and fails, as it would in the cluster.
* **Service names.** ``host:port`` in any env value or argument whose host is a Service's DNS
  name (``name``, ``name.ns``, ``name.ns.svc``, ``name.ns.svc.cluster.local``) and whose port is
  one of its ports becomes ``127.0.0.1:<local port>`` of the pod the Service selects (the
  first replica: there is no load balancing here), or the stand-in's address.
* **Volumes.** Each mount path is a directory of ``<work>``: ``emptyDir`` one per pod and
  volume, ``secret``/``configMap`` the object's keys as files (``items`` honoured), a
  PersistentVolumeClaim one per claim (the same claim mounted twice is the same directory),
  the V2 server's claims its model repository. Absolute paths under a mount path in env
  values and arguments are rewritten to the directory.
* **The process environment** is the image's ``ENV`` (the Dockerfile's last stage), then the
  rendered env so rewritten, plus ``PATH`` (this interpreter first: ``python`` is this
  environment's), ``HOME`` (a directory of the pod) and ``PYTHONPATH`` (the checkout, where
  the image has the installed packages). Nothing of the caller's environment leaks in.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.errors import ConfigError
from podium_app.deploy.manifest import JOB_KINDS, Container, Objects, Pod, Probe, Service, pods
from podium_app.deploy.render import ROOT
from podium_app.deploy.standins import (
    BrokerAccess,
    JaegerPorts,
    OperatorFiles,
    V2Access,
    all_services,
    is_collector,
    is_trace_backend,
    jaeger_config,
    jaeger_ports,
    operator_secrets,
    selects,
    strimzi_secrets,
    v2_services,
)
from podium_app.kafka_broker import free_port

PODIUM_IMAGE = "podium"
"""The repository name of Podium's image (k8s/base/kustomization.yaml rewrites ``podium`` to
``ghcr.io/podium-rl/podium:<tag>``)."""

DEAD = "127.0.0.1:{port}"


def is_podium_image(image: str, name: str = PODIUM_IMAGE) -> bool:
    """``ghcr.io/x/podium:0.1.0``, ``podium``, ``podium@sha256:..`` -> True."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    return last.split(":", 1)[0] == name


def image_env(dockerfile: Path = ROOT / "Dockerfile") -> dict[str, str]:
    """The ``ENV`` of the Dockerfile's last stage (``ENV K=V [K=V ...]``)."""
    env: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        words = line.strip().split(None, 1)
        if not words:
            continue
        if words[0].upper() == "FROM":
            env = {}
        elif words[0].upper() == "ENV" and len(words) == 2:
            for item in shlex.split(words[1]):
                key, sep, value = item.partition("=")
                if not sep:
                    raise ConfigError(f"{dockerfile}: ENV {words[1]!r}: use the K=V form")
                env[key] = value
    return env


@dataclass(frozen=True)
class LocalContainer:
    """One container as a local process."""

    container: Container
    argv: tuple[str, ...]
    env: Mapping[str, str]
    """The whole process environment."""
    probes: tuple[tuple[Probe, str], ...]
    """Each declared probe and the ``127.0.0.1:<local port>`` it is sent to."""
    workdir: Path
    podium: bool = True
    """False for a stand-in run in place of a non-Podium image (the trace backend): the
    static check skips it; it starts before and stops after the Podium containers."""

    @property
    def where(self) -> str:
        return self.container.where


@dataclass(frozen=True)
class Plan:
    """Everything needed to start the deployment and talk to it."""

    objects: Objects
    pods: tuple[Pod, ...]
    init: tuple[LocalContainer, ...]
    containers: tuple[LocalContainer, ...]
    addresses: Mapping[tuple[str, int], str]
    """(Service DNS name, port) -> local ``host:port``."""
    replaced: tuple[str, ...]
    """Workloads not run (non-Podium images), with what stands in for them."""
    operator: OperatorFiles
    work_dir: Path
    jobs: tuple[LocalContainer, ...] = ()
    """The containers of Job pods: run to completion beside the others (a failure fails the
    deployment)."""
    trace_query: str = ""
    """``host:port`` of the local Jaeger's query API (``/api/traces/<id>``) and UI; empty when
    no trace backend runs."""
    trace_otlp: str = ""
    """``host:port`` of the local Jaeger's OTLP/gRPC receiver (where the collector's Service
    resolves); empty when no trace backend runs."""

    def address(self, service: str, port: int) -> str:
        """The local address of ``service:port`` (any of its DNS names)."""
        try:
            return self.addresses[(service, port)]
        except KeyError:
            raise ConfigError(f"no Service {service}:{port} in the rendered overlay") from None


def make_plan(
    objects: Objects,
    work_dir: Path,
    broker: BrokerAccess,
    v2: V2Access,
    image: str = PODIUM_IMAGE,
    jaeger: Path | None = None,
) -> Plan:
    """Stand-ins added, pods listed, ports and addresses assigned, volumes materialized;
    ``jaeger``: the binary run for the trace backend (None: not run)."""
    generated, operator = operator_secrets(objects, work_dir)
    objects = objects.with_secrets({**strimzi_secrets(objects, broker), **generated})
    all_pods = tuple(pods(objects))
    ours = [
        c
        for p in all_pods
        for c in (*p.init_containers, *p.containers)
        if is_podium_image(c.image, image)
    ]

    def runs(c: Container) -> bool:
        return is_podium_image(c.image, image) or (jaeger is not None and is_trace_backend(c.image))

    svcs = all_services(objects)
    v2_named = v2_services(ours, svcs)
    ports = {p.name: _port_table(p, runs) for p in all_pods}
    backends = {
        c.where: (c, jaeger_ports(c, ports[p.name]))
        for p in all_pods
        for c in p.containers
        if jaeger is not None and is_trace_backend(c.image)
    }
    trace_otlp = next((f"127.0.0.1:{j.otlp_grpc}" for _, j in backends.values()), "")
    addresses, replaced = _addresses(
        objects, all_pods, svcs, ports, broker, v2, v2_named, runs, trace_otlp
    )
    v2_claims = _claims_of(all_pods, [s for s in svcs if s.name in v2_named])
    base_env = image_env()
    init: list[LocalContainer] = []
    containers: list[LocalContainer] = []
    jobs: list[LocalContainer] = []
    for pod in all_pods:
        dirs = materialize(pod, objects, work_dir, v2.repository, v2_claims)
        for c in (*pod.init_containers, *pod.containers):
            if is_podium_image(c.image, image):
                local = localize(c, ports[pod.name], addresses, dirs, base_env, work_dir)
                (init if c.init else jobs if pod.kind in JOB_KINDS else containers).append(local)
            elif c.where in backends and jaeger is not None:
                containers.append(
                    backend(c, backends[c.where][1], ports[pod.name], jaeger, work_dir)
                )
    query = next((f"127.0.0.1:{j.query_http}" for _, j in backends.values()), "")
    return Plan(
        objects,
        all_pods,
        tuple(init),
        tuple(containers),
        addresses,
        tuple(replaced),
        operator,
        work_dir,
        tuple(jobs),
        trace_query=query,
        trace_otlp=trace_otlp,
    )


def backend(
    c: Container, jaeger_at: JaegerPorts, ports: Mapping[int, int], jaeger: Path, work_dir: Path
) -> LocalContainer:
    """The trace backend's container as the Jaeger binary on its generated config (its
    image's command does not apply: the binary replaces the image)."""
    home = work_dir / "pods" / c.pod / "home" / c.name
    home.mkdir(parents=True, exist_ok=True)
    config = home / "jaeger.yaml"
    config.write_text(jaeger_config(jaeger_at))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)}
    probes = tuple((p, f"127.0.0.1:{ports[p.port]}") for p in c.probes)
    return LocalContainer(c, (str(jaeger), f"--config={config}"), env, probes, home, podium=False)


_PORT_VAR = re.compile(r".*_PORT$")


def _port_numbers(c: Container, base_env: Mapping[str, str]) -> set[int]:
    numbers = set(c.ports.values())
    numbers.update(p.port for p in c.probes)
    for name, value in [*base_env.items(), *c.env]:
        if _PORT_VAR.match(name) and value.strip().isdigit() and 0 < int(value) < 65536:
            numbers.add(int(value))
    return numbers


def _port_table(pod: Pod, runs: Callable[[Container], bool]) -> dict[int, int]:
    """Container port -> free local port, for every port the pod's local containers use."""
    base_env = image_env()
    numbers: set[int] = set()
    for c in (*pod.init_containers, *pod.containers):
        if runs(c):
            numbers |= _port_numbers(c, base_env)
    return {n: free_port() for n in sorted(numbers)}


def _target_port(pod: Pod, target: int | str) -> int | None:
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in pod.containers:
        if target in c.ports:
            return c.ports[str(target)]
    return None


def _addresses(
    objects: Objects,
    all_pods: Sequence[Pod],
    svcs: Sequence[Service],
    ports: Mapping[str, Mapping[int, int]],
    broker: BrokerAccess,
    v2: V2Access,
    v2_named: Mapping[str, str],
    runs: Callable[[Container], bool],
    trace_otlp: str,
) -> tuple[dict[tuple[str, int], str], list[str]]:
    """Every (DNS name, port) of every Service -> a local address; the replaced workloads."""
    kafka = {f"{o['metadata']['name']}-kafka-bootstrap" for o in objects.kind("Kafka")}
    out: dict[tuple[str, int], str] = {}
    replaced: dict[str, str] = {}
    for svc in svcs:
        backing = [p for p in all_pods if selects(svc, p)]
        collector = bool(trace_otlp) and any(
            is_collector(c.image) for p in backing for c in p.containers
        )
        for sp in svc.ports:
            address = (
                trace_otlp
                if collector
                else _service_address(
                    svc,
                    sp.name,
                    sp.port,
                    sp.target,
                    backing,
                    ports,
                    broker,
                    v2,
                    v2_named,
                    kafka,
                    runs,
                )
            )
            for dns in svc.dns_names():
                out[(dns, sp.port)] = address
        for p in backing:
            replaced.update(_replacement(p, svc.name in v2_named, collector, runs))
    return out, [f"{w}: {what}" for w, what in sorted(replaced.items())]


def _replacement(
    pod: Pod, v2: bool, collector: bool, runs: Callable[[Container], bool]
) -> dict[str, str]:
    """What stands in for ``pod``'s workload, if it is not a Podium one (docs/operations.md)."""
    if any(runs(c) and not is_trace_backend(c.image) for c in pod.containers):
        return {}  # a Podium workload
    if any(runs(c) for c in pod.containers):
        return {pod.workload: "the Jaeger binary (scripts/jaeger.sh), generated config"}
    if v2:
        return {pod.workload: "the local V2 server"}
    if collector:
        return {pod.workload: "not run: its Service is the local Jaeger's OTLP/gRPC receiver"}
    return {pod.workload: "not run"}


def _service_address(
    svc: Service,
    port_name: str,
    port: int,
    target: int | str,
    backing: Sequence[Pod],
    ports: Mapping[str, Mapping[int, int]],
    broker: BrokerAccess,
    v2: V2Access,
    v2_named: Mapping[str, str],
    kafka: set[str],
    runs: Callable[[Container], bool],
) -> str:
    if svc.name in kafka:
        return broker.bootstrap
    if svc.name in v2_named:
        if (port_name or f"#{port}") == v2_named[svc.name]:
            return v2.grpc
        if port_name == "http":
            return v2.http
        return DEAD.format(port=free_port())
    for pod in backing:
        if any(runs(c) for c in pod.containers):
            number = _target_port(pod, target)
            if number is not None and number in ports[pod.name]:
                return f"127.0.0.1:{ports[pod.name][number]}"
    return DEAD.format(port=free_port())


def _claims_of(all_pods: Sequence[Pod], v2: Sequence[Service]) -> set[str]:
    """The PersistentVolumeClaims mounted by the pods the V2 Services select."""
    claims = set()
    for pod in all_pods:
        if any(selects(s, pod) for s in v2):
            for source in pod.volumes.values():
                claim = source.get("persistentVolumeClaim")
                if claim:
                    claims.add(str(claim["claimName"]))
    return claims


def materialize(
    pod: Pod, objects: Objects, work_dir: Path, repository: Path, v2_claims: set[str]
) -> dict[str, Path]:
    """Volume name -> its local directory, with Secret/ConfigMap keys written as files."""
    dirs: dict[str, Path] = {}
    for name, source in pod.volumes.items():
        dirs[name] = _volume(pod, name, source, objects, work_dir, repository, v2_claims)
    return dirs


def _volume(
    pod: Pod,
    name: str,
    source: Mapping[str, Any],
    objects: Objects,
    work_dir: Path,
    repository: Path,
    v2_claims: set[str],
) -> Path:
    where = work_dir / "pods" / pod.name / "volumes" / name
    if "emptyDir" in source:
        where.mkdir(parents=True, exist_ok=True)
        return where
    if "persistentVolumeClaim" in source:
        claim = str(source["persistentVolumeClaim"]["claimName"])
        path = repository if claim in v2_claims else work_dir / "claims" / claim
        path.mkdir(parents=True, exist_ok=True)
        return path
    for key, table, ref in (
        ("secret", objects.secrets, "secretName"),
        ("configMap", objects.config_maps, "name"),
    ):
        if key in source:
            spec = source[key]
            data = table.get(str(spec[ref]))
            if data is None:
                if spec.get("optional"):
                    data = {}
                else:
                    raise ConfigError(
                        f"{pod.name}: volume {name!r}: {key} {spec[ref]!r} does not exist"
                    )
            _write_files(where, data, spec.get("items"))
            return where
    raise ConfigError(f"{pod.name}: volume {name!r}: unsupported source {sorted(source)}")


def _write_files(
    where: Path, data: Mapping[str, str], items: Iterable[Mapping[str, str]] | None
) -> None:
    where.mkdir(parents=True, exist_ok=True)
    chosen = [(str(i["key"]), str(i["path"])) for i in items] if items else [(k, k) for k in data]
    for key, rel in chosen:
        if key not in data:
            raise ConfigError(f"volume {where.name!r}: no key {key!r}")
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[key])
        path.chmod(0o600)


def localize(
    c: Container,
    ports: Mapping[int, int],
    addresses: Mapping[tuple[str, int], str],
    dirs: Mapping[str, Path],
    base_env: Mapping[str, str],
    work_dir: Path,
) -> LocalContainer:
    """The container's process: argv and env rewritten by the rules of the module docstring."""
    if not c.argv:
        raise ConfigError(f"{c.where}: no command: the local deployment needs it spelled out")
    mounts = sorted(
        ((m.path, dirs[m.volume] / m.sub_path if m.sub_path else dirs[m.volume]) for m in c.mounts),
        key=lambda pair: -len(pair[0]),
    )
    for m in c.mounts:
        if m.volume not in dirs:
            raise ConfigError(f"{c.where}: volumeMount of an undeclared volume {m.volume!r}")

    def value(name: str, raw: str) -> str:
        if _PORT_VAR.match(name) and raw.strip().isdigit() and int(raw) in ports:
            return str(ports[int(raw)])
        return rewrite_paths(rewrite_hosts(raw, addresses), mounts)

    home = work_dir / "pods" / c.pod / "home" / c.name
    home.mkdir(parents=True, exist_ok=True)
    env = {k: value(k, v) for k, v in base_env.items()}
    env.update({k: value(k, v) for k, v in c.env})
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        PATH=os.pathsep.join([bin_dir, "/usr/local/bin", "/usr/bin", "/bin"]),
        HOME=str(home),
        PYTHONPATH=str(ROOT),
    )
    argv = tuple(rewrite_paths(rewrite_hosts(a, addresses), mounts) for a in c.argv)
    probes = tuple((p, f"127.0.0.1:{ports[p.port]}") for p in c.probes)
    return LocalContainer(c, argv, env, probes, home)


_HOST_PORT = re.compile(r"(?<![\w.-])([a-z0-9][a-z0-9.-]*):(\d{1,5})(?!\d)")


def rewrite_hosts(text: str, addresses: Mapping[tuple[str, int], str]) -> str:
    """``service[.ns[.svc[.cluster.local]]]:port`` -> its local address (others unchanged)."""

    def one(m: re.Match[str]) -> str:
        return addresses.get((m.group(1), int(m.group(2))), m.group(0))

    return _HOST_PORT.sub(one, text)


def rewrite_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """An absolute path at or under a mount path -> the same path under its directory (one
    pass, longest mount path first, so a rewritten path is never rewritten again)."""
    if not mounts:
        return text
    table = {mount.rstrip("/") or "/": local for mount, local in mounts}
    alternatives = "|".join(re.escape(m) for m in sorted(table, key=len, reverse=True))
    pattern = re.compile(r"(?<![\w./-])(" + alternatives + r")(?=/|$|[&,;\s\"'])")
    return pattern.sub(lambda m: str(table[m.group(1)]), text)


__all__ = [
    "PODIUM_IMAGE",
    "LocalContainer",
    "Plan",
    "backend",
    "image_env",
    "is_podium_image",
    "localize",
    "make_plan",
    "materialize",
    "rewrite_hosts",
    "rewrite_paths",
]
