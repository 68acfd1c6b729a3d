"""The swarm environment in Gymnasium's registry: ``gymnasium.make("podium/Swarm-v0")``.

Importing :mod:`podium.envs` registers it (Gymnasium has no plugin discovery), so either::

    import podium.envs
    env = gymnasium.make("podium/Swarm-v0")

or, with nothing imported first, Gymnasium's ``module:id`` form::

    env = gymnasium.make("podium.envs:podium/Swarm-v0", tasks=my_tasks, pool=my_pool)

Keyword arguments go through to :class:`~podium.envs.swarm.env.SwarmEnv`: ``tasks`` (task
specs, shipped tasks' names such as ``login-system``, task files or directories; default: the
shipped task library), ``pool`` (a ``PoolSpec``; or a shipped pool's name, ``default``,
``misadvertised`` or ``unseen``, or a pool file's path), ``config`` (an
:class:`~podium.envs.swarm.env.EnvConfig` or a dict of its fields, so a plain-data call site
such as a YAML experiment file can set them), ``true_pool`` and ``stats``. The spaces are
Gymnasium's own (a ``Box`` observation, a ``Discrete`` action), so Stable-Baselines3 trains on
it as it is: an action outside the valid set is charged a penalty and reported rather than
raised (``EnvConfig.invalid_action="penalize"``, the default), and ``env.unwrapped
.action_masks()`` is the boolean mask in the form sb3-contrib's ``MaskablePPO`` asks for.
The episode step limit is the environment's own (``EnvConfig.max_steps``), so the registration
adds no ``TimeLimit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import gymnasium

from podium.envs.swarm.env import EnvConfig, SwarmEnv
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import (
    PoolSpec,
    TaskSpec,
    default_pool,
    default_pool_path,
    default_tasks,
    load_pool,
    load_tasks,
)
from podium.errors import ConfigError

SWARM_ENV_ID = "podium/Swarm-v0"
"""Gymnasium id of :class:`~podium.envs.swarm.env.SwarmEnv`."""

SWARM_ENTRY_POINT = "podium.envs.registration:make_swarm_env"
"""What Gymnasium calls to build it (:func:`make_swarm_env`)."""

CONTEXT_ENV_ID = "podium/Context-v0"
"""Gymnasium id of :class:`~podium.context.env.ContextEnv` (keyword arguments: ``index``, an
opened index or its directory; ``questions``, a list or a question file; ``config``; see
:func:`podium.context.env.make_context_env`)."""

CONTEXT_ENTRY_POINT = "podium.context.env:make_context_env"
"""A string, so registering it imports nothing of the search stack until the env is made."""


def resolve_pool(
    pool: PoolSpec | SubagentPool | str | Path | None,
) -> PoolSpec | SubagentPool | None:
    """A pool as given, a shipped pool by name (``podium/data/pools/<name>.yaml``), or a file."""
    if pool is None or isinstance(pool, PoolSpec | SubagentPool):
        return pool
    shipped = default_pool_path().parent / f"{pool}.yaml"
    path = shipped if isinstance(pool, str) and shipped.is_file() else Path(pool)
    if not path.is_file():
        names = sorted(p.stem for p in default_pool_path().parent.glob("*.yaml"))
        raise ConfigError(
            f"pool {str(pool)!r} is neither a shipped pool ({', '.join(names)}) nor a file"
        )
    return load_pool(path)


def resolve_config(config: EnvConfig | Mapping[str, Any] | None) -> EnvConfig | None:
    """An :class:`EnvConfig` as given, or built from a dict of its fields (unknown ones named)."""
    if config is None or isinstance(config, EnvConfig):
        return config
    known = {f.name for f in fields(EnvConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(
            f"EnvConfig has no field {', '.join(map(repr, unknown))} (fields: {', '.join(sorted(known))})"
        )
    return EnvConfig(**config)


TaskArg = TaskSpec | str | Path
"""A task: a spec, a shipped task's name (``login-system``) or a task file or directory."""


def resolve_tasks(
    tasks: TaskArg | Sequence[TaskArg] | None, pool: PoolSpec | None
) -> list[TaskSpec]:
    """Task specs from specs, shipped task names and paths; None: the shipped library. Each is
    checked against ``pool`` (default: the default pool)."""
    library = {t.name: t for t in default_tasks(pool)}
    if tasks is None:
        return list(library.values())
    out: list[TaskSpec] = []
    for task in [tasks] if isinstance(tasks, TaskSpec | str | Path) else tasks:
        if isinstance(task, TaskSpec):
            out.append(task)
        elif isinstance(task, str) and task in library:
            out.append(library[task])
        elif Path(task).exists():
            out += load_tasks(task, pool if pool is not None else default_pool())
        else:
            raise ConfigError(
                f"task {str(task)!r} is neither a shipped task ({', '.join(sorted(library))}) "
                "nor a task file or directory"
            )
    return out


def make_swarm_env(
    tasks: TaskArg | Sequence[TaskArg] | None = None,
    pool: PoolSpec | SubagentPool | str | Path | None = None,
    config: EnvConfig | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> SwarmEnv:
    """:class:`SwarmEnv` as ``gymnasium.make`` builds it (see the module docstring)."""
    resolved = resolve_pool(pool)
    specs = resolve_tasks(tasks, resolved if isinstance(resolved, PoolSpec) else None)
    return SwarmEnv(specs, resolved, resolve_config(config), **kwargs)


def register_envs() -> None:
    """Register :data:`SWARM_ENV_ID` and :data:`CONTEXT_ENV_ID` (once: importing twice does
    not re-register)."""
    if SWARM_ENV_ID not in gymnasium.registry:
        gymnasium.register(id=SWARM_ENV_ID, entry_point=SWARM_ENTRY_POINT)
    if CONTEXT_ENV_ID not in gymnasium.registry:
        gymnasium.register(id=CONTEXT_ENV_ID, entry_point=CONTEXT_ENTRY_POINT)
