"""What the local deployment checks before anything starts: env vars and transactional ids.

* :func:`read_variables`: every environment variable some Podium code reads, found by walking
  the code, never kept as a list by hand: the ``env("NAME")`` fields of every dataclass in
  ``podium/`` and the four services (:func:`podium.config.env`; for a container that runs the
  ``podium`` CLI, such as the cold-start Job, those of ``podium_app/`` too), the SASL password
  :class:`podium.bus.KafkaConfig` reads beside its URL, and the ``OTEL_*`` names the
  OpenTelemetry SDK and API declare (``opentelemetry.sdk.environment_variables``,
  ``opentelemetry.environment_variables``);
* :func:`unread_variables`: a variable a Podium container sets that none of those reads is a
  mistake (a misspelling, a retired setting, a setting of another service): it is named with
  its container;
* :func:`fencing_problems`: the consume-transform-produce services (reward_svc; the
  orchestrator's task intake) take transactional ids ``<prefix>.<topic>.<partition>``
  (:mod:`podium.bus.transform`): every replica of a workload must use the same consumer group
  AND the same prefix, or a partition moving between replicas is not fenced (a zombie commits
  beside its successor), and one prefix must not serve two groups (they would fence each
  other forever). Both are read from each replica's resolved env through the services' own
  configs, so what is checked is what the processes will use.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from podium.config import from_env
from podium.errors import ConfigError
from podium_app.deploy.manifest import Container

_log = logging.getLogger(__name__)

CODE_PACKAGES = ("podium", "orchestrator_svc", "subagent_svc", "reward_svc", "learner_svc")
"""Where the configs live (the top floor reads no service setting)."""

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str) -> list[str]:
    """Every module of ``package`` by walking its files (namespace sub-packages included,
    which ``pkgutil.walk_packages`` would skip)."""
    root = ROOT / package
    names = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if "__pycache__" not in parts:
            names.append(".".join(parts))
    return names


def env_fields(modules: Iterable[str]) -> set[str]:
    """The ``env(...)`` variable names of every dataclass found in ``modules``.

    A module that cannot be imported because an optional third-party package is absent (the
    MLServer adapter) is skipped with a log line: what it declares is not read here either.
    """
    names: set[str] = set()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] in CODE_PACKAGES:
                raise
            _log.info("not walked (optional dependency %s absent): %s", exc.name, name)
            continue
        for value in vars(module).values():
            if isinstance(value, type) and dataclasses.is_dataclass(value):
                names.update(
                    str(f.metadata["env"]) for f in dataclasses.fields(value) if "env" in f.metadata
                )
    return names


def otel_variables() -> set[str]:
    """The ``OTEL_*`` names OpenTelemetry's SDK and API declare as constants."""
    import opentelemetry.environment_variables as api
    import opentelemetry.sdk.environment_variables as sdk

    return {
        v
        for module in (api, sdk)
        for v in vars(module).values()
        if isinstance(v, str) and v.startswith("OTEL_")
    }


TOP_FLOOR = "podium_app"
"""The CLI's package: its commands' settings count for a container that runs ``podium``."""
CLI = "podium"
"""The console script of the top floor (``pyproject.toml``)."""


def runs_cli(argv: Sequence[str]) -> bool:
    """Whether a container's command is the ``podium`` CLI (``podium ...``, any path)."""
    return bool(argv) and Path(argv[0]).name == CLI


@cache
def read_variables(top_floor: bool = False) -> frozenset[str]:
    """Every variable some Podium code reads (see the module docstring); with ``top_floor``,
    the CLI's commands' settings too."""
    from podium.bus.kafka import SASL_PASSWORD_ENV

    packages = (*CODE_PACKAGES, TOP_FLOOR) if top_floor else CODE_PACKAGES
    modules = [m for package in packages for m in _modules(package)]
    return frozenset(env_fields(modules) | otel_variables() | {SASL_PASSWORD_ENV})


def unread_variables(containers: Iterable[Container], known: frozenset[str]) -> list[str]:
    """``<pod>/<container>: <VAR> is read by no config`` for each variable no code reads."""
    problems = []
    for c in containers:
        for name in dict.fromkeys(c.env_names):
            if name not in known:
                problems.append(
                    f"{c.where}: {name} is set but read by no config (not an env() field of "
                    "podium/ or a service, nor a standard OTEL_* variable)"
                )
    return problems


@dataclass(frozen=True)
class Fencing:
    """The consumer group and transactional-id prefix a replica will use."""

    group: str
    prefix: str


def _reward(env: Mapping[str, str]) -> Fencing:
    from reward_svc.config import RewardServiceConfig

    config = from_env(RewardServiceConfig, env)
    return Fencing(config.group_id, config.transactional_id_prefix)


def _orchestrator(env: Mapping[str, str]) -> Fencing:
    from orchestrator_svc.config import OrchestratorConfig

    # orchestrator_svc.intake.TaskIntake: group and prefix are both "<PODIUM_GROUP_ID>.tasks".
    group = f"{from_env(OrchestratorConfig, env).group_id}.tasks"
    return Fencing(group, group)


TRANSACTIONAL: Mapping[str, Callable[[Mapping[str, str]], Fencing]] = {
    "reward_svc": _reward,
    "orchestrator_svc": _orchestrator,
}
"""``python -m <module>`` -> how its config names its group and transactional-id prefix."""


def module_of(argv: Sequence[str]) -> str:
    """``python -m X ...`` -> ``X``; anything else -> empty."""
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1] == "-m":
        return argv[2]
    return ""


def fencing_problems(
    containers: Iterable[Container], envs: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """Replicas that would not fence each other, or workloads that would fence each other.

    ``envs`` is each container's process environment by :attr:`Container.where`; a container
    whose config does not load is left to fail on its own start (with its config's message).
    """
    by_workload: dict[str, dict[str, Fencing]] = {}
    for c in containers:
        read = TRANSACTIONAL.get(module_of(c.argv))
        if read is None:
            continue
        try:
            fencing = read(envs[c.where])
        except ConfigError:
            continue
        by_workload.setdefault(f"{c.workload}/{c.name}", {})[c.pod] = fencing
    problems = []
    for workload, replicas in sorted(by_workload.items()):
        if len(set(replicas.values())) > 1:
            shown = ", ".join(
                f"{p}: group {f.group!r} ids {f.prefix}.*" for p, f in replicas.items()
            )
            problems.append(
                f"{workload}: replicas use different consumer groups or transactional-id "
                f"prefixes ({shown}); every replica must use the same ones, or a partition "
                "moving between replicas is not fenced and a zombie replica commits twice"
            )
    groups_of_prefix: dict[str, set[tuple[str, str]]] = {}
    for workload, replicas in by_workload.items():
        for f in replicas.values():
            groups_of_prefix.setdefault(f.prefix, set()).add((workload, f.group))
    for prefix, users in sorted(groups_of_prefix.items()):
        if len({g for _, g in users}) > 1:
            shown = ", ".join(f"{w} (group {g!r})" for w, g in sorted(users))
            problems.append(
                f"transactional-id prefix {prefix!r} is used by different consumer groups: "
                f"{shown}; each would fence the other's producers at every claim"
            )
    return problems


__all__ = [
    "CODE_PACKAGES",
    "TRANSACTIONAL",
    "Fencing",
    "env_fields",
    "fencing_problems",
    "module_of",
    "otel_variables",
    "read_variables",
    "runs_cli",
    "unread_variables",
]
