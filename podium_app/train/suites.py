"""What ``podium train`` trains on: the pools and the task suites, and how the report names them.

* **The pool** is the user's (``--pool FILE``) or the shipped default. It is what the
  planners see (the *advertised* profiles: rule engines, observation, lower bound); when it
  carries ``true:`` profiles (docs/specs.md) the simulated sub-agents draw from those instead,
  as real ones behave otherwise than they advertise.
* **Pool variants** (``--pool-variants N``, :func:`podium.envs.swarm.pools.pool_variants`):
  N more pools derived from it, renamed, reshaped and wrong about themselves in different
  ways, so the policy learns to trust what it observes of an agent over what it advertises.
* **Tasks** are the user's library (``--tasks DIR_OR_FILE``, validated against the pool) or,
  without one, seeded generated suites over the pool's kinds (as before). A user library is
  split by hashing task names (exact shares, rounded up, at least one task each):
  :attr:`TrainConfig.test_fraction` of it is held out for the final table,
  :attr:`TrainConfig.validation_fraction` of the rest chooses the best version;
  with fewer than :attr:`TrainConfig.min_tasks_to_hold_out` tasks nothing is held out and the
  final table measures the training tasks themselves (the report says so).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.envs.swarm import PoolSpec, TaskSpec, default_pool, load_pool, load_tasks
from podium.envs.swarm.generator import (
    DEFAULT_KINDS,
    GENERALIST_ONLY_KINDS,
    generate_suite,
    held_out_split,
)
from podium.envs.swarm.pools import deviations, pool_variants
from podium.envs.swarm.spec import WILDCARD_KIND, default_pool_path
from podium_app.train.config import TrainConfig

GENERATED = "generated"
"""The task source of a run without ``--tasks``."""


@dataclass(frozen=True, slots=True)
class TrainPool:
    """One pool the actor runs sessions on."""

    spec: PoolSpec
    """The pool as loaded or derived: its agents are the advertisement; ``spec.truth`` (if
    any) is how they behave."""
    source: str
    """Where it came from: the pool file's path, or ``variant <i> of <base>``."""

    @property
    def advertised(self) -> PoolSpec:
        """What planners see (the truth stripped)."""
        return self.spec.advertised()

    @property
    def truth(self) -> PoolSpec | None:
        """What the simulator draws from when it is not the advertisement; None otherwise."""
        return self.spec.true_spec() if self.spec.has_truth else None


@dataclass(slots=True)
class Suites:
    """The run's task suites and where they came from."""

    train: list[TaskSpec]
    validation: list[TaskSpec]
    test: list[TaskSpec]
    max_size: int
    """The most subtasks of any task (the encoding's slots)."""
    source: str
    """The ``--tasks`` path, or :data:`GENERATED`."""
    held_out: str
    """How the final table's tasks were chosen, in words (for the report)."""


def load_train_pool(path: Path | None) -> TrainPool:
    """The run's pool: the file ``path`` (validated; SpecError naming it) or the shipped
    default."""
    if path is None:
        return TrainPool(default_pool(), str(default_pool_path()))
    return TrainPool(load_pool(path), str(path))


def training_pools(config: TrainConfig) -> list[TrainPool]:
    """The base pool, then its :attr:`TrainConfig.pool_variants` variants (seeded by the
    run's seed)."""
    base = load_train_pool(config.pool)
    variants = pool_variants(base.spec, config.pool_variants, config.seed)
    return [
        base,
        *(TrainPool(v, f"variant {i} of {base.spec.name}") for i, v in enumerate(variants, 1)),
    ]


def generator_kinds(pool: PoolSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(kinds, extra kinds) a generated suite draws for ``pool``: the kinds its agents name
    (the shipped generator's order first, so the default pool gets the suites it always got),
    and, when a generalist (``"*"``) covers the rest, :data:`GENERALIST_ONLY_KINDS` it does
    not name (see :attr:`TrainConfig.extra_kind_p`)."""
    kinds = tuple(k for k in DEFAULT_KINDS if k in pool.kinds)
    kinds += tuple(k for k in pool.kinds if k not in DEFAULT_KINDS)
    wildcard = any(WILDCARD_KIND in a.kinds for a in pool.agents)
    if not kinds:  # generalists only: they do any kind, so the shipped kinds will do
        kinds = DEFAULT_KINDS
    extra = tuple(k for k in GENERALIST_ONLY_KINDS if k not in pool.kinds) if wildcard else ()
    return kinds, extra


def generated_suites(config: TrainConfig, pool: PoolSpec) -> Suites:
    """The seeded suites of a run without ``--tasks`` (over ``pool``'s kinds): training and
    validation from one suite (hashed split), the held-out test suite from another seed."""
    kinds, extra = generator_kinds(pool)
    suite = generate_suite(
        config.suite_size,
        seed=config.seed + 1,
        sizes=config.sizes,
        kinds=kinds,
        extra_kinds=extra,
        extra_kind_p=config.extra_kind_p,
    )
    train, validation = held_out_split(suite, config.validation_fraction, salt="val")
    test = generate_suite(
        config.test_suite_size, seed=config.seed + 10_007, sizes=config.test_sizes, kinds=kinds
    )
    return Suites(
        train,
        validation,
        test,
        max(len(t.subtasks) for t in [*suite, *test]),
        GENERATED,
        f"{len(test)} tasks generated with another seed (sizes {config.test_sizes[0]}–"
        f"{config.test_sizes[1]})",
    )


def _hash(task: TaskSpec, salt: str) -> bytes:
    return hashlib.sha256(f"{salt}:{task.name}".encode()).digest()


def _hold_out(
    tasks: Sequence[TaskSpec], fraction: float, salt: str
) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(kept, held out), each in the given order: the ``ceil(fraction × n)`` tasks (at least
    one) whose names hash lowest. Deterministic and independent of file order; an exact share
    rather than :func:`~podium.envs.swarm.generator.held_out_split`'s hash threshold, which on
    a library of a dozen tasks holds out anywhere from none to half of them."""
    k = max(1, math.ceil(fraction * len(tasks)))
    held = {t.name for t in sorted(tasks, key=lambda t: _hash(t, salt))[:k]}
    return [t for t in tasks if t.name not in held], [t for t in tasks if t.name in held]


def split_library(
    tasks: Sequence[TaskSpec], config: TrainConfig
) -> tuple[list[TaskSpec], list[TaskSpec], list[TaskSpec], str]:
    """(train, validation, test, how) of a user's task library (each in file order, the
    order rule engines break ties in); see the module docstring."""
    n = len(tasks)
    if n < config.min_tasks_to_hold_out:
        every = list(tasks)
        return (
            every,
            every,
            every,
            f"none: fewer than {config.min_tasks_to_hold_out} tasks, so validation and the "
            f"final table run the {n} training tasks themselves (fit, not generalisation)",
        )
    rest, test = _hold_out(tasks, config.test_fraction, "test")
    train, validation = _hold_out(rest, config.validation_fraction, "val")
    return (
        train,
        validation,
        test,
        f"{len(test)} of the {n} tasks (chosen by a hash of their names, never trained on)",
    )


def library_suites(config: TrainConfig, path: Path, pool: PoolSpec) -> Suites:
    """The suites of a user's task library at ``path`` (every task checked against ``pool``;
    SpecError naming the file)."""
    tasks = load_tasks(path, pool)
    train, validation, test, how = split_library(tasks, config)
    return Suites(train, validation, test, max(len(t.subtasks) for t in tasks), str(path), how)


def task_suites(config: TrainConfig, pool: PoolSpec) -> Suites:
    """The run's suites: the user's library when ``config.tasks`` names one, else generated."""
    if config.tasks is None:
        return generated_suites(config, pool)
    return library_suites(config, config.tasks, pool)


def describe_pool(pool: TrainPool) -> dict[str, Any]:
    """A pool as the report and ``summary.json`` name it (``deviations``: per agent, how its
    true profiles depart from its advertisement: honest, slower, flakier or better)."""
    return {
        "name": pool.spec.name,
        "source": pool.source,
        "agents": list(pool.spec.agent_names()),
        "kinds": list(pool.spec.kinds),
        "true_profiles": pool.spec.has_truth,
        "deviations": {a: d.value for a, d in deviations(pool.spec).items()},
    }


def describe(pools: Sequence[TrainPool], suites: Suites) -> dict[str, Any]:
    """What the run trained on: the pool (name, file, agents, whether it carries true
    profiles), its variants, and the tasks (source, counts and names of each split, how the
    final table's tasks were chosen)."""
    return {
        "pool": describe_pool(pools[0]),
        "variants": [describe_pool(p) for p in pools[1:]],
        "tasks": {
            "source": suites.source,
            "count": len({t.name for t in [*suites.train, *suites.validation, *suites.test]}),
            "held_out": suites.held_out,
            "train": [t.name for t in suites.train],
            "validation": [t.name for t in suites.validation],
            "test": [t.name for t in suites.test],
        },
    }


__all__ = [
    "GENERATED",
    "Suites",
    "TrainPool",
    "describe",
    "describe_pool",
    "generated_suites",
    "generator_kinds",
    "library_suites",
    "load_train_pool",
    "split_library",
    "task_suites",
    "training_pools",
]
