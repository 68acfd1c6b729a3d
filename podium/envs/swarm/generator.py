"""Seeded generators of task specs: shapes (chain, fan-out, diamond, layered random DAG) and
suites of them, plus a deterministic held-out split.

Everything takes an explicit seed and uses its own ``random.Random``, so the same call gives
the same tasks on every machine; the shipped library in ``podium/data/tasks`` was written by
:func:`write_library` and is checked against it by the tests.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path

import yaml

from podium.envs.swarm.spec import Subtask, TaskSpec, parse_task, task_to_dict
from podium.errors import ConfigError

DEFAULT_KINDS: tuple[str, ...] = (
    "ui",
    "api",
    "db",
    "security",
    "infra",
    "test",
    "docs",
    "research",
)
"""Kinds the default pool covers with specialists."""

GENERALIST_ONLY_KINDS: tuple[str, ...] = ("state", "mobile", "ml")
"""Kinds the default pool runs on its generalist only (the login-system's ``state``); in the
observation they share the "other" kind."""

SHAPES: tuple[str, ...] = ("chain", "fanout", "diamond", "layered")
"""Shapes :func:`generate_task` knows."""


def _work(rng: random.Random) -> float:
    # Heavy-ish tail: most subtasks small, a few large ones that are worth splitting.
    return round(min(12.0, rng.lognormvariate(0.8, 0.6)), 2)


def _sub(
    rng: random.Random,
    i: int,
    kinds: Sequence[str],
    deps: Sequence[int],
    split_p: float,
    extra_kinds: Sequence[str] = (),
    extra_kind_p: float = 0.0,
) -> Subtask:
    work = _work(rng)
    # No extra draw without extra kinds: the shipped library stays what it was generated as.
    extra = bool(extra_kinds) and rng.random() < extra_kind_p
    return Subtask(
        id=f"t{i:02d}",
        kind=rng.choice(list(extra_kinds if extra else kinds)),
        work=work,
        deps=tuple(f"t{d:02d}" for d in deps),
        splittable=work >= 3.0 and rng.random() < split_p,
        sensitive=rng.random() < 0.05,
    )


def generate_task(
    shape: str,
    n: int,
    seed: int,
    *,
    kinds: Sequence[str] = DEFAULT_KINDS,
    split_p: float = 0.5,
    name: str | None = None,
    max_parallel: int | None = None,
    extra_kinds: Sequence[str] = (),
    extra_kind_p: float = 0.0,
) -> TaskSpec:
    """One task of ``shape`` with ``n`` subtasks (validated through :func:`parse_task`).

    ``extra_kinds`` are drawn instead of ``kinds`` with probability ``extra_kind_p`` per
    subtask: kinds no specialist covers (see :data:`GENERALIST_ONLY_KINDS`), so a policy
    trained on such suites has met the pool's "other" kind before a task like the
    login-system's ``state`` subtask shows it one.
    """
    if shape not in SHAPES:
        raise ConfigError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if n < 2:
        raise ConfigError(f"a task needs at least 2 subtasks, got n={n}")
    rng = random.Random(f"{shape}:{n}:{seed}")
    deps: list[list[int]] = [[] for _ in range(n)]
    if shape == "chain":
        for i in range(1, n):
            deps[i] = [i - 1]
    elif shape == "fanout":
        # root -> n-2 independent branches -> join
        for i in range(1, n - 1):
            deps[i] = [0]
        deps[n - 1] = list(range(1, n - 1)) if n > 2 else [0]
    elif shape == "diamond":
        # Stacked diamonds of width w: a -> w parallel -> b -> w parallel -> ...
        w = max(2, min(4, n // 4))
        i, joint = 1, 0
        while i < n:
            width = min(w, n - i - 1) if n - i > 1 else 0
            mids = list(range(i, i + width))
            for m in mids:
                deps[m] = [joint]
            i += width
            if i < n:
                deps[i] = mids or [joint]
                joint = i
                i += 1
    else:  # layered random DAG
        layers = max(2, round(n**0.5))
        layer_of = sorted(rng.randrange(layers) for _ in range(n))
        layer_of[0] = 0
        for i in range(n):
            earlier = [j for j in range(i) if layer_of[j] < layer_of[i]]
            if earlier:
                recent = [j for j in earlier if layer_of[j] == layer_of[i] - 1] or earlier
                deps[i] = sorted({rng.choice(recent), *(j for j in earlier if rng.random() < 0.08)})
    subs = [_sub(rng, i, kinds, deps[i], split_p, extra_kinds, extra_kind_p) for i in range(n)]
    task = TaskSpec(
        name=name or f"{shape}-{n}-s{seed}", subtasks=tuple(subs), max_parallel=max_parallel
    )
    return parse_task(task_to_dict(task))  # validation, and a canonical form


def generate_suite(
    n: int,
    seed: int,
    *,
    sizes: tuple[int, int] = (5, 60),
    shapes: Sequence[str] = SHAPES,
    kinds: Sequence[str] = DEFAULT_KINDS,
    extra_kinds: Sequence[str] = (),
    extra_kind_p: float = 0.0,
) -> list[TaskSpec]:
    """``n`` tasks of random shapes and sizes in ``[sizes[0], sizes[1]]``, names unique
    (``extra_kinds`` / ``extra_kind_p``: see :func:`generate_task`)."""
    lo, hi = sizes
    if not 2 <= lo <= hi:
        raise ConfigError(f"sizes must satisfy 2 <= min <= max, got {sizes}")
    rng = random.Random(seed)
    out: list[TaskSpec] = []
    for i in range(n):
        shape = rng.choice(list(shapes))
        size = rng.randint(lo, hi)
        out.append(
            generate_task(
                shape,
                size,
                rng.getrandbits(32),
                kinds=kinds,
                name=f"{shape}-{size}-{seed}-{i}",
                extra_kinds=extra_kinds,
                extra_kind_p=extra_kind_p,
            )
        )
    return out


def held_out_split(
    tasks: Sequence[TaskSpec], fraction: float = 0.2, salt: str = "podium"
) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(train, held-out) by hashing each task's name: stable when the suite grows or is
    reordered, so a task never moves between the two sides."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"fraction must be in [0, 1], got {fraction}")
    train: list[TaskSpec] = []
    held: list[TaskSpec] = []
    for t in tasks:
        h = int.from_bytes(hashlib.sha256(f"{salt}:{t.name}".encode()).digest()[:8], "big")
        (held if h / 2**64 < fraction else train).append(t)
    return train, held


def library_tasks() -> list[TaskSpec]:
    """The generated part of the shipped library (hand-written tasks live only as files)."""
    return [
        generate_task("chain", 8, 1, name="chain-8"),
        generate_task("fanout", 12, 2, name="fanout-12"),
        generate_task("fanout", 30, 3, name="fanout-30"),
        generate_task("diamond", 10, 4, name="diamond-10"),
        generate_task("diamond", 25, 5, name="diamond-25"),
        generate_task("layered", 5, 6, name="layered-5"),
        generate_task("layered", 15, 7, name="layered-15"),
        generate_task("layered", 30, 8, name="layered-30"),
        generate_task("layered", 45, 9, name="layered-45"),
        generate_task("layered", 60, 10, name="layered-60"),
    ]


def write_library(directory: str | Path) -> list[Path]:
    """Write :func:`library_tasks` as YAML files into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in library_tasks():
        p = d / f"{t.name}.yaml"
        p.write_text(
            "# Generated by podium.envs.swarm.generator.library_tasks(); do not edit by hand.\n"
            + yaml.safe_dump(task_to_dict(t), sort_keys=False),
            encoding="utf-8",
        )
        paths.append(p)
    return paths
