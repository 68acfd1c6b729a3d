"""Rendered Kubernetes objects read as the kubelet would: pods, containers, env, probes, volumes.

Pure functions over the objects ``kustomize build`` printed (no I/O). What the kubelet does and
this module reproduces:

* a Deployment or StatefulSet of ``replicas`` gives that many pods; StatefulSet pods are
  ``<name>-<ordinal>`` as in a cluster, Deployment pods ``<name>-<ordinal>`` here too (a cluster
  names them ``<name>-<hash>-<random>``; nothing in Podium reads that name); a Job gives one
  pod, ``<name>-0`` (its ``parallelism`` other than 1 is refused);
* a container's environment: ``envFrom`` first (ConfigMap or Secret keys, with ``prefix``),
  then ``env`` in order (later wins); ``valueFrom`` resolves ``configMapKeyRef`` and
  ``secretKeyRef`` against the Secrets and ConfigMaps given (``optional`` honoured),
  ``fieldRef`` ``metadata.name`` / ``metadata.namespace`` / ``metadata.labels['k']`` to the
  pod's, ``status.podIP`` / ``status.hostIP`` to loopback; ``$(VAR)`` references to earlier
  variables are expanded (``$$`` escapes), as Kubernetes does;
* the process is ``command`` + ``args`` (empty for a container that relies on its image's
  entrypoint; the local deployment refuses that for a Podium container).

Anything else (resourceFieldRef, a missing Secret key that is not optional, a probe on a port
name the container does not declare) is a :class:`ConfigError` naming the container, exactly
where a cluster would refuse to start it.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from podium.errors import ConfigError

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
"""The kinds whose pods the local deployment runs and keeps running."""
JOB_KINDS = ("Job",)
"""The kinds whose pods the local deployment runs to completion."""

CLUSTER_DOMAIN = "cluster.local"
"""The cluster's DNS domain (kubelet default)."""

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class Probe:
    """A probe: ``grpc`` (grpc.health.v1 Check), ``http`` (GET, 200-399) or ``tcp``."""

    kind: str
    port: int
    """The container port it targets (a named port already resolved to its number)."""
    path: str = ""
    """HTTP path (``http`` only)."""
    service: str = ""
    """grpc.health.v1 service name (``grpc`` only; empty = the server as a whole)."""
    which: str = "readiness"
    """``readiness``, ``liveness`` or ``startup``: all must pass (a liveness probe on a port
    nothing serves restarts the pod forever, a startup probe keeps it from ever serving)."""


@dataclass(frozen=True)
class Mount:
    """One ``volumeMounts`` entry."""

    volume: str
    path: str
    sub_path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class Container:
    """One container of one pod, its environment resolved."""

    pod: str
    """The pod's name (``<workload>-<ordinal>``)."""
    workload: str
    name: str
    image: str
    argv: tuple[str, ...]
    """``command`` + ``args``."""
    env: tuple[tuple[str, str], ...]
    """The resolved environment, in the order Kubernetes builds it (duplicates: last wins)."""
    env_names: tuple[str, ...]
    """Every variable name the manifest sets (``env`` and the keys ``envFrom`` brings)."""
    ports: Mapping[str, int]
    """Declared container ports by name (unnamed ports under ``"#<number>"``)."""
    probes: tuple[Probe, ...]
    """Its startup, liveness and readiness probes (those declared)."""
    mounts: tuple[Mount, ...]
    init: bool = False
    grace_s: float = 30.0
    """The pod's ``terminationGracePeriodSeconds``: SIGTERM, then SIGKILL after this long."""

    @property
    def readiness(self) -> Probe | None:
        return next((p for p in self.probes if p.which == "readiness"), None)

    @property
    def where(self) -> str:
        """``pod/container``, how every message names it."""
        return f"{self.pod}/{self.name}"

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Pod:
    """One replica of a workload."""

    name: str
    workload: str
    kind: str
    namespace: str
    ordinal: int
    labels: Mapping[str, str]
    volumes: Mapping[str, Mapping[str, Any]]
    """Volume name -> its source (``emptyDir``, ``secret``, ``persistentVolumeClaim``...);
    a StatefulSet's claim templates appear as ``persistentVolumeClaim`` of
    ``<template>-<pod>``, as the controller names them."""
    init_containers: tuple[Container, ...]
    containers: tuple[Container, ...]


@dataclass(frozen=True)
class ServicePort:
    name: str
    port: int
    target: int | str


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str
    selector: Mapping[str, str]
    ports: tuple[ServicePort, ...]

    def dns_names(self) -> tuple[str, ...]:
        """How a pod may name it: ``name``, ``name.ns``, ``name.ns.svc``, the FQDN."""
        n, ns = self.name, self.namespace
        return (n, f"{n}.{ns}", f"{n}.{ns}.svc", f"{n}.{ns}.svc.{CLUSTER_DOMAIN}")


@dataclass(frozen=True)
class Objects:
    """The rendered objects, indexed by kind and name."""

    items: tuple[Mapping[str, Any], ...]
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Secret name -> decoded data (rendered ones, plus stand-ins added by the caller)."""
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, items: Sequence[Mapping[str, Any]]) -> Objects:
        secrets = {name_of(o): secret_data(o) for o in items if o.get("kind") == "Secret"}
        maps = {name_of(o): config_map_data(o) for o in items if o.get("kind") == "ConfigMap"}
        return cls(tuple(items), secrets, maps)

    def kind(self, kind: str) -> list[Mapping[str, Any]]:
        return [o for o in self.items if o.get("kind") == kind]

    def with_secrets(self, extra: Mapping[str, Mapping[str, str]]) -> Objects:
        """These objects with ``extra`` Secrets added or replacing rendered ones."""
        return Objects(self.items, {**self.secrets, **extra}, self.config_maps)


def name_of(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "default")


def secret_data(obj: Mapping[str, Any]) -> dict[str, str]:
    """A Secret's values as text: ``data`` (base64) overlaid by ``stringData``."""
    out = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: str(v) for k, v in (obj.get("stringData") or {}).items()})
    return out


def config_map_data(obj: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (obj.get("data") or {}).items()}


def services(objects: Objects) -> list[Service]:
    """Every Service with its ports."""
    out = []
    for o in objects.kind("Service"):
        spec = o.get("spec", {})
        ports = tuple(
            ServicePort(str(p.get("name", "")), int(p["port"]), p.get("targetPort", p["port"]))
            for p in spec.get("ports", [])
        )
        out.append(Service(name_of(o), namespace_of(o), spec.get("selector") or {}, ports))
    return out


def pods(objects: Objects) -> list[Pod]:
    """Every pod of every Deployment, StatefulSet and Job, its containers' env resolved."""
    out: list[Pod] = []
    for workload in objects.items:
        kind = workload.get("kind")
        if kind in JOB_KINDS:
            parallelism = int(workload.get("spec", {}).get("parallelism", 1))
            if parallelism != 1:
                raise ConfigError(
                    f"Job {name_of(workload)}: parallelism {parallelism}: the local deployment "
                    "runs one pod per Job"
                )
            out.append(_pod(objects, workload, 0))
        elif kind in WORKLOAD_KINDS:
            replicas = int(workload.get("spec", {}).get("replicas", 1))
            out.extend(_pod(objects, workload, i) for i in range(replicas))
    return out


def _pod(objects: Objects, workload: Mapping[str, Any], ordinal: int) -> Pod:
    name, namespace = name_of(workload), namespace_of(workload)
    template = workload["spec"]["template"]
    spec = template.get("spec", {})
    pod_name = f"{name}-{ordinal}"
    labels = {str(k): str(v) for k, v in (template.get("metadata", {}).get("labels") or {}).items()}
    volumes = {str(v["name"]): v for v in spec.get("volumes") or []}
    for claim in workload.get("spec", {}).get("volumeClaimTemplates") or []:
        template_name = name_of(claim)
        volumes[template_name] = {
            "name": template_name,
            "persistentVolumeClaim": {"claimName": f"{template_name}-{pod_name}"},
        }
    grace = float(spec.get("terminationGracePeriodSeconds", 30))
    ctx = _PodContext(objects, pod_name, name, namespace, labels, grace)

    def build(specs: Sequence[Mapping[str, Any]], init: bool) -> tuple[Container, ...]:
        return tuple(container(ctx, c, init) for c in specs)

    return Pod(
        name=pod_name,
        workload=name,
        kind=str(workload["kind"]),
        namespace=namespace,
        ordinal=ordinal,
        labels=labels,
        volumes=volumes,
        init_containers=build(spec.get("initContainers") or [], True),
        containers=build(spec.get("containers") or [], False),
    )


@dataclass(frozen=True)
class _PodContext:
    objects: Objects
    pod: str
    workload: str
    namespace: str
    labels: Mapping[str, str]
    grace_s: float


PROBES = (
    ("startup", "startupProbe"),
    ("liveness", "livenessProbe"),
    ("readiness", "readinessProbe"),
)


def container(ctx: _PodContext, spec: Mapping[str, Any], init: bool) -> Container:
    """One container of the pod, env resolved and probe port resolved."""
    where = f"{ctx.pod}/{spec.get('name')}"
    env, names = resolve_env(ctx, spec, where)
    ports = {
        str(p.get("name") or f"#{p['containerPort']}"): int(p["containerPort"])
        for p in spec.get("ports") or []
    }
    argv = tuple(str(a) for a in [*(spec.get("command") or []), *(spec.get("args") or [])])
    mounts = tuple(
        Mount(
            str(m["name"]),
            str(m["mountPath"]),
            str(m.get("subPath", "")),
            bool(m.get("readOnly", False)),
        )
        for m in spec.get("volumeMounts") or []
    )
    return Container(
        pod=ctx.pod,
        workload=ctx.workload,
        name=str(spec["name"]),
        image=str(spec.get("image", "")),
        argv=tuple(expand(a, dict(env)) for a in argv),
        env=tuple(env),
        env_names=tuple(names),
        ports=ports,
        probes=tuple(
            p
            for which, key in PROBES
            if (p := probe(spec.get(key), ports, where, which)) is not None
        ),
        mounts=mounts,
        init=init,
        grace_s=ctx.grace_s,
    )


def probe(
    spec: Mapping[str, Any] | None, ports: Mapping[str, int], where: str, which: str = "readiness"
) -> Probe | None:
    """The probe with its port resolved to a number (a named port through ``ports``: a name
    the container does not declare fails, as the kubelet fails it)."""
    if not spec:
        return None
    for kind, key in (("grpc", "grpc"), ("http", "httpGet"), ("tcp", "tcpSocket")):
        action = spec.get(key)
        if action is None:
            continue
        raw = action.get("port")
        if isinstance(raw, str) and not raw.isdigit():
            if raw not in ports:
                raise ConfigError(f"{where}: {which} probe port {raw!r} is not a declared port")
            number = ports[raw]
        else:
            number = int(raw)
        return Probe(
            kind, number, str(action.get("path", "")), str(action.get("service", "")), which
        )
    raise ConfigError(f"{where}: {which} probe of an unsupported kind: {sorted(spec)}")


def resolve_env(
    ctx: _PodContext, spec: Mapping[str, Any], where: str
) -> tuple[list[tuple[str, str]], list[str]]:
    """``envFrom`` then ``env``, as (name, value) in order, and the names the manifest sets."""
    env: list[tuple[str, str]] = []
    for source in spec.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        data = _env_from(ctx.objects, source, where)
        env.extend((prefix + k, v) for k, v in data.items())
    for var in spec.get("env") or []:
        name = str(var["name"])
        if "valueFrom" in var:
            value = _value_from(ctx, var["valueFrom"], f"{where} {name}")
            if value is None:
                continue  # an optional reference that is absent: the variable is not set
        else:
            value = expand(str(var.get("value", "")), dict(env))
        env.append((name, value))
    return env, [n for n, _ in env]


def _env_from(objects: Objects, source: Mapping[str, Any], where: str) -> Mapping[str, str]:
    for key, table, what in (
        ("configMapRef", objects.config_maps, "ConfigMap"),
        ("secretRef", objects.secrets, "Secret"),
    ):
        ref = source.get(key)
        if ref is None:
            continue
        name = str(ref["name"])
        if name in table:
            return table[name]
        if ref.get("optional"):
            return {}
        raise ConfigError(f"{where}: envFrom {what} {name!r} does not exist")
    raise ConfigError(f"{where}: unsupported envFrom source {sorted(source)}")


def _value_from(ctx: _PodContext, source: Mapping[str, Any], where: str) -> str | None:
    for key, table, what in (
        ("configMapKeyRef", ctx.objects.config_maps, "ConfigMap"),
        ("secretKeyRef", ctx.objects.secrets, "Secret"),
    ):
        ref = source.get(key)
        if ref is None:
            continue
        name, item = str(ref["name"]), str(ref["key"])
        value = table.get(name, {}).get(item)
        if value is None and not ref.get("optional"):
            raise ConfigError(f"{where}: {what} {name!r} has no key {item!r}")
        return value
    if "fieldRef" in source:
        return _field(ctx, str(source["fieldRef"]["fieldPath"]), where)
    raise ConfigError(f"{where}: unsupported valueFrom {sorted(source)}")


def _field(ctx: _PodContext, path: str, where: str) -> str:
    simple = {
        "metadata.name": ctx.pod,
        "metadata.namespace": ctx.namespace,
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return simple[path]
    label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
    if label and label.group(1) in ctx.labels:
        return ctx.labels[label.group(1)]
    raise ConfigError(f"{where}: unsupported fieldRef {path!r}")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined
    reference is left as written, ``$$`` is a literal ``$``."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(one, value)


__all__ = [
    "CLUSTER_DOMAIN",
    "JOB_KINDS",
    "WORKLOAD_KINDS",
    "Container",
    "Mount",
    "Objects",
    "Pod",
    "Probe",
    "Service",
    "ServicePort",
    "config_map_data",
    "expand",
    "name_of",
    "namespace_of",
    "pods",
    "probe",
    "secret_data",
    "services",
]
