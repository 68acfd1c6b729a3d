"""Frozen dataclass configs read from environment variables, failing fast and by name.

A service declares its settings once, as a frozen dataclass whose fields say which variable
they come from::

    @dataclass(frozen=True)
    class SubagentConfig:
        bus_url: str = env("PODIUM_BUS", parse=parse_bus_url)
        \"\"\"Where the Kafka broker is.\"\"\"
        batch_max: int = env("PODIUM_BATCH_MAX", default=64)
        \"\"\"Most records handled per fetch.\"\"\"

    config = from_env(SubagentConfig)

:func:`from_env` reads every variable, converts it with the field's type (or its ``parse``),
and raises one :class:`~podium.errors.ConfigError` that names every missing variable and every
invalid value, so an operator fixes a deployment in one round trip instead of one per setting.
Fields without ``env(...)`` metadata keep their dataclass default; code (tests, the embedded
mode) builds configs directly with the constructor and skips the environment entirely.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import os
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from podium.errors import ConfigError

T = TypeVar("T")

_REQUIRED = object()
"""Sentinel: the variable has no default and must be set."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def env(
    name: str,
    *,
    default: Any = _REQUIRED,
    parse: Callable[[str], Any] | None = None,
) -> Any:
    """A dataclass field read from environment variable ``name``.

    ``default`` omitted means the variable is required. ``parse`` converts the raw string
    (raise ``ValueError`` or :class:`ConfigError` to reject it); without it the field's
    annotated type decides (str, int, float, bool, Path, ``X | None`` and tuples of those,
    comma-separated).
    """
    if not name:
        raise ConfigError("env(): the variable name must not be empty")
    metadata = {"env": name, "parse": parse}
    if default is _REQUIRED:
        # A dataclass field without a default would force every later field to have none
        # either; the sentinel keeps ordering free and from_env() enforces "required".
        return dataclasses.field(default=_REQUIRED, metadata=metadata)
    if isinstance(default, list | dict | set):
        raise ConfigError(f"{name}: mutable defaults are not allowed in a frozen config")
    return dataclasses.field(default=default, metadata=metadata)


def env_var(cls: type[Any], field_name: str) -> str:
    """Name of the environment variable behind ``cls.field_name``."""
    for f in dataclasses.fields(cls):
        if f.name == field_name and "env" in f.metadata:
            return str(f.metadata["env"])
    raise ConfigError(f"{cls.__name__}.{field_name} is not read from the environment")


def from_env(cls: type[T], environ: Mapping[str, str] | None = None, **overrides: Any) -> T:
    """Build ``cls`` from ``environ`` (default ``os.environ``); ``overrides`` win over it.

    Raises one :class:`ConfigError` listing every missing or invalid variable.
    """
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"{cls!r} is not a dataclass")
    source = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    problems: list[str] = []
    for f in dataclasses.fields(cls):
        if f.name in overrides:
            values[f.name] = overrides[f.name]
            continue
        var = f.metadata.get("env")
        if var is None:
            continue
        raw = source.get(var)
        if raw is None or raw.strip() == "":
            if f.default is _REQUIRED:
                doc = _field_doc(cls, f.name)
                problems.append(f"{var} is required but not set" + (f" ({doc})" if doc else ""))
            continue
        parse = f.metadata.get("parse")
        try:
            values[f.name] = parse(raw) if parse is not None else convert(raw, hints[f.name])
        except (ValueError, ConfigError) as exc:
            problems.append(f"{var}={raw!r} is invalid: {exc}")
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        problems.append(f"unknown {cls.__name__} settings: {', '.join(sorted(unknown))}")
    if problems:
        raise ConfigError(f"{cls.__name__}: " + "; ".join(problems))
    try:
        obj = cls(**values)
    except (ValueError, ConfigError) as exc:  # __post_init__ cross-field checks
        raise ConfigError(f"{cls.__name__}: {exc}") from exc
    require_set(obj)
    return obj


def require_set(obj: Any) -> None:
    """Raise if a required setting of ``obj`` was never given (call from ``__post_init__``).

    Only reachable when a config is built with its constructor and a required field is left
    out; :func:`from_env` reports missing variables before that.
    """
    missing = [
        f.metadata.get("env", f.name)
        for f in dataclasses.fields(obj)
        if getattr(obj, f.name) is _REQUIRED
    ]
    if missing:
        raise ConfigError(
            f"{type(obj).__name__}: required setting(s) not given: {', '.join(missing)}"
        )


def convert(raw: str, annotation: Any) -> Any:
    """Convert ``raw`` to ``annotation`` (str, int, float, bool, Path, optionals, tuples)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise ConfigError(f"unsupported union type {annotation!r}; give the field a parse=")
        return convert(raw, args[0])
    if origin is tuple:
        items = typing.get_args(annotation)
        item = items[0] if items else str
        return tuple(convert(part.strip(), item) for part in raw.split(",") if part.strip())
    if annotation is str:
        return raw
    if annotation is bool:
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("expected a boolean (1/0, true/false, yes/no, on/off)")
    if annotation is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
    if annotation is float:
        try:
            return float(raw.strip())
        except ValueError:
            raise ValueError("expected a number") from None
    if annotation is Path:
        return Path(raw)
    raise ConfigError(f"unsupported field type {annotation!r}; give the field a parse=")


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's docstring (the string literal right after it in the class body, cleaned
    as :func:`inspect.cleandoc` does), by name, a subclass's over its bases'; a field without
    one is absent. Read from the source: Python keeps no attribute docstrings at run time."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        first = tree.body[0] if tree.body else None
        body: list[ast.stmt] = first.body if isinstance(first, ast.ClassDef) else []
        for stmt, nxt in itertools.pairwise(body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _field_doc(cls: type[Any], name: str) -> str:
    """First line of the docstring of field ``name`` of ``cls`` (best effort; "" if none)."""
    doc = field_docs(cls).get(name, "")
    return doc.splitlines()[0] if doc else ""


# --- parsers shared by the services ------------------------------------------------------


def is_port(text: str) -> bool:
    """Whether ``text`` is a TCP port, 1-65535, in ASCII digits (``str.isdigit`` alone also
    accepts ``"²"``, on which ``int`` raises)."""
    return 0 < len(text) <= 5 and text.isascii() and text.isdigit() and 0 < int(text) < 65536


def positive_int(raw: str) -> int:
    """An integer > 0."""
    value = convert(raw, int)
    assert isinstance(value, int)
    if value <= 0:
        raise ValueError("expected an integer > 0")
    return value


def positive_float(raw: str) -> float:
    """A number > 0."""
    value = convert(raw, float)
    assert isinstance(value, float)
    if value <= 0:
        raise ValueError("expected a number > 0")
    return value


def non_negative_int(raw: str) -> int:
    """An integer >= 0."""
    value = convert(raw, int)
    assert isinstance(value, int)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def non_negative_float(raw: str) -> float:
    """A finite number >= 0."""
    value = convert(raw, float)
    assert isinstance(value, float)
    if not math.isfinite(value) or value < 0:
        raise ValueError("expected a finite number >= 0")
    return value


def port(raw: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    value = convert(raw, int)
    assert isinstance(value, int)
    if not 0 <= value <= 65535:
        raise ValueError("expected a TCP port in 0..65535")
    return value


def parse_bus_url(raw: str) -> str:
    """A bus URL a standalone process can share with others: ``kafka://HOST:PORT[,HOST:PORT]``.

    ``inproc://`` is rejected here on purpose: an in-process bus lives inside one process,
    so a standalone service on it would silently talk to nobody.
    """
    url = raw.strip()
    parts = urlsplit(url)
    if parts.scheme in ("inproc", "memory"):
        raise ValueError(
            f"{parts.scheme}:// only works when all services share one process (podium demo/train); "
            "a standalone service needs a broker, e.g. kafka://127.0.0.1:9092"
        )
    from podium.bus import is_kafka_url  # lazy: config must not pull in aiokafka early
    from podium.bus.kafka import KafkaConfig

    if not is_kafka_url(url):
        raise ValueError("expected kafka://HOST:PORT[,HOST:PORT...]")
    hosts = [h for h in parts.netloc.split(",") if h]
    if not hosts:
        raise ValueError("no broker address after kafka://")
    for hostport in hosts:
        host, sep, p = hostport.rpartition(":")
        if not sep or not host or not is_port(p):
            raise ValueError(f"broker address {hostport!r} is not HOST:PORT")
    KafkaConfig.from_url(url)  # checks ?option=value settings (raises ConfigError)
    return url


def log_level(raw: str) -> str:
    """A logging level name."""
    value = raw.strip().upper()
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError("expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    return value


HEALTH_PORT_ENV = "PODIUM_HEALTH_PORT"
"""Variable naming the port of every standalone service's ``grpc.health.v1`` server."""
METRICS_PORT_ENV = "PODIUM_METRICS_PORT"
"""Variable naming the port of every standalone service's Prometheus endpoint (``/metrics``)."""


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """The ports a platform probes and scrapes (health and metrics), on their own.

    :class:`ServiceConfig` extends it, so every service declares the settings through the base;
    :func:`podium.service.run_standalone` reads it alone (``from_env(HealthConfig)``) for an
    app whose config is not a :class:`ServiceConfig`, so every process gets the same variables.
    """

    health_port: int = env(HEALTH_PORT_ENV, default=0, parse=port)
    """Port of the ``grpc.health.v1`` server of a standalone process (all interfaces).
    0 = a free port chosen by the OS and logged: several processes on one host (the local
    drivers, the tests) never collide. Deployments fix it; the k8s manifests set 8081, where
    their ``grpc`` readiness and liveness probes look."""
    metrics_port: int = env(METRICS_PORT_ENV, default=0, parse=port)
    """Port of the Prometheus endpoint (``/metrics``, all interfaces) of a standalone process:
    the metrics of :mod:`podium.metrics`. 0 = no endpoint (a process that is not scraped
    binds nothing); the k8s manifests set 9464, where the scrape annotations point."""


@dataclasses.dataclass(frozen=True)
class ServiceConfig(HealthConfig):
    """Settings every service has; each service's config extends it."""

    bus_url: str = env("PODIUM_BUS", parse=parse_bus_url)
    """Event bus: ``kafka://HOST:PORT[,HOST:PORT]`` (required for a standalone process)."""
    instance: str = env("PODIUM_INSTANCE", default="")
    """Name of this process in logs, traces and dead letters; empty = ``<svc>/<host>-<pid>``."""
    log_level: str = env("PODIUM_LOG_LEVEL", default="INFO", parse=log_level)
    """Logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL."""
    topic_partitions: int = env("PODIUM_TOPIC_PARTITIONS", default=3, parse=positive_int)
    """Partitions of topics this service creates if they do not exist yet."""
    shutdown_timeout_s: float = env("PODIUM_SHUTDOWN_TIMEOUT_S", default=30.0, parse=positive_float)
    """How long a graceful stop may take to finish the batch in hand before abandoning it
    (abandoned records are not committed, so they are redelivered, never lost)."""

    def __post_init__(self) -> None:
        require_set(self)
