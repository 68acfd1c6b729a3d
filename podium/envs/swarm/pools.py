"""Pool variants: other pools over the same kinds, whose advertisements are wrong.

A policy trained on one pool whose spec tells the truth learns to read the spec. A real
deployment's sub-agents are not what they advertise (slower, flakier, sometimes better), and
their names and number change. :func:`pool_variants` derives, from one base pool, pools that
differ in exactly those ways, so a training suite can mix them and the policy learns to weigh
what it observes of an agent against what the agent advertises:

* **renamed and reordered** agents (``v<i>-agent-<j>``): names and positions carry nothing;
* **other agent counts**: one redundant agent may be dropped (never one whose kinds would
  then be uncovered) and one near-copy of an agent added;
* **perturbed advertisements**: each profile's speed, success and noise moved a little, so no
  two variants advertise the same numbers;
* **hidden true profiles** (:attr:`PoolSpec.truth`, the ``true:`` of a pool file): each agent
  behaves as advertised, or *slower*, *flakier* or *better* than advertised; every variant of
  three or more agents has at least one agent of each of the three wrong kinds, and which
  agents, and by how much, differ from variant to variant.

Everything is drawn from ``random.Random`` seeded by (seed, variant index), so a variant
depends only on the base pool, the seed and its index: the same call gives the same pools on
every machine, and ``pool_variants(base, n, s)[:m] == pool_variants(base, m, s)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from podium.envs.swarm.spec import WILDCARD_KIND, AgentSpec, KindProfile, PoolSpec
from podium.errors import ConfigError


class Deviation(Enum):
    """How an agent's true behaviour departs from its advertisement."""

    HONEST = "honest"
    """As advertised."""
    SLOWER = "slower"
    """Every kind takes longer than advertised (speed × 0.45–0.75)."""
    FLAKIER = "flakier"
    """Every kind fails more often than advertised (success − 0.2–0.4, at least 0.25) and
    its durations spread more (noise × 1.3)."""
    BETTER = "better"
    """Every kind is faster than advertised (speed × 1.25–1.6) and no less reliable."""
    MIXED = "mixed"
    """Wrong in several of these ways at once (never drawn here; a hand-written ``true:``
    can say so)."""


WRONG_WAYS: tuple[Deviation, ...] = (Deviation.SLOWER, Deviation.FLAKIER, Deviation.BETTER)
"""The deviations every variant of three or more agents contains at least once each."""

_OTHER_WEIGHTS: tuple[tuple[Deviation, float], ...] = (
    (Deviation.HONEST, 0.4),
    (Deviation.SLOWER, 0.2),
    (Deviation.FLAKIER, 0.2),
    (Deviation.BETTER, 0.2),
)
"""How the agents past the first three are drawn: honest agents stay common, so the policy
also learns that an advertisement is often right."""

MIN_TRUE_SUCCESS = 0.25
"""Floor of a flakier agent's true success: the loop guard allows a few retries per agent, and
an agent that almost never succeeds would make sessions incomplete rather than slow."""


@dataclass(frozen=True, slots=True)
class VariantAgent:
    """One agent of a variant before it is named: its advertisement and how it deviates."""

    advertised: AgentSpec
    deviation: Deviation


def _digits(x: float) -> float:
    """``x`` to five significant digits: readable in reports, never rounded to zero."""
    return float(f"{x:.5g}")


def _covered(agents: Sequence[AgentSpec]) -> set[str]:
    """Kinds (``"*"`` included) some agent of ``agents`` can do with success > 0."""
    return {k for a in agents for k, p in a.kinds.items() if p.success > 0}


def _perturb_advertised(profile: KindProfile, rng: random.Random) -> KindProfile:
    """The base profile moved a little (speed ±20 % log-normal, success ±0.05, noise
    × 0.8–1.25): another pool advertising similar, not identical, numbers. A kind the agent
    cannot do (success 0) stays undoable."""
    success = profile.success
    if success > 0:
        success = min(1.0, max(0.3, success + rng.gauss(0.0, 0.05)))
    return KindProfile(
        speed=_digits(profile.speed * math.exp(rng.gauss(0.0, 0.2))),
        success=_digits(success),
        noise=_digits(profile.noise * rng.uniform(0.8, 1.25)),
    )


def _true_profile(advertised: KindProfile, deviation: Deviation, factor: float) -> KindProfile:
    """How the agent really performs a kind it advertises ``advertised`` for; ``factor`` in
    [0, 1] places it within the deviation's range (one draw per agent, so all its kinds are
    wrong the same way)."""
    speed, success, noise = advertised.speed, advertised.success, advertised.noise
    if deviation is Deviation.HONEST or success <= 0:
        return advertised
    if deviation is Deviation.SLOWER:
        speed *= 0.45 + 0.3 * factor
    elif deviation is Deviation.FLAKIER:
        success = min(success, max(MIN_TRUE_SUCCESS, success - (0.2 + 0.2 * factor)))
        noise *= 1.3
    else:
        speed *= 1.25 + 0.35 * factor
        success = min(1.0, success + 0.1 * factor)
    return KindProfile(speed=_digits(speed), success=_digits(success), noise=_digits(noise))


def _reshaped(base: Sequence[AgentSpec], rng: random.Random) -> list[AgentSpec]:
    """The base agents with, each with probability 1/2, one redundant agent dropped (one
    whose every kind another agent also covers) and one near-copy of an agent added: the
    variants' agent counts differ from the base's and from each other's."""
    agents = list(base)
    needed = _covered(base)
    if rng.random() < 0.5:
        droppable = [
            i for i in range(len(agents)) if _covered(agents[:i] + agents[i + 1 :]) >= needed
        ]
        if droppable and len(agents) > 1:
            agents.pop(rng.choice(droppable))
    if rng.random() < 0.5:
        agents.append(rng.choice(agents))  # perturbed below like every agent: a near-copy
    return agents


def _deviations(count: int, rng: random.Random) -> list[Deviation]:
    """One deviation per agent: each of :data:`WRONG_WAYS` at least once (when there are
    that many agents), the rest drawn from :data:`_OTHER_WEIGHTS`, in a random order."""
    ways, weights = zip(*_OTHER_WEIGHTS, strict=True)
    out = list(WRONG_WAYS[:count])
    out += rng.choices(ways, weights=weights, k=count - len(out))
    rng.shuffle(out)
    return out


def variant_agents(base: PoolSpec, index: int, seed: int) -> list[VariantAgent]:
    """Variant ``index``'s agents in order, before naming: reshaped, perturbed, each with its
    deviation (see the module docstring)."""
    rng = random.Random(f"podium.pool_variants:{base.name}:{seed}:{index}")
    agents = _reshaped(base.agents, rng)
    rng.shuffle(agents)
    deviations = _deviations(len(agents), rng)
    return [
        VariantAgent(
            AgentSpec(
                name=a.name,
                kinds={k: _perturb_advertised(p, rng) for k, p in a.kinds.items()},
            ),
            deviation,
        )
        for a, deviation in zip(agents, deviations, strict=True)
    ]


PoolSpecPair = tuple[tuple[AgentSpec, ...], tuple[AgentSpec, ...]]
"""A variant's agents as advertised and as they truly behave (same names, order, kinds)."""


def _named(agents: Sequence[VariantAgent], index: int, rng: random.Random) -> PoolSpecPair:
    """(advertised, true) agent tuples of variant ``index``, renamed ``v<index>-agent-<j>``."""
    advertised: list[AgentSpec] = []
    truth: list[AgentSpec] = []
    for j, va in enumerate(agents):
        name = f"v{index}-agent-{j}"
        factor = rng.random()
        kinds: Mapping[str, KindProfile] = va.advertised.kinds
        advertised.append(AgentSpec(name=name, kinds=dict(kinds)))
        truth.append(
            AgentSpec(
                name=name,
                kinds={k: _true_profile(p, va.deviation, factor) for k, p in kinds.items()},
            )
        )
    return tuple(advertised), tuple(truth)


def pool_variant(base: PoolSpec, index: int, seed: int) -> PoolSpec:
    """Variant ``index`` (>= 1) of ``base``: a pool whose :attr:`~PoolSpec.agents` are the
    advertisement and whose :attr:`~PoolSpec.truth` is how they behave (``true_spec()``);
    named ``<base>-v<index>``. The base's own truth, if any, is not used: a variant's truth
    is drawn around its own advertisement."""
    if index < 1:
        raise ConfigError(f"pool variant index must be >= 1, got {index}")
    agents = variant_agents(base.advertised(), index, seed)
    advertised, truth = _named(
        agents, index, random.Random(f"podium.pool_variants.truth:{base.name}:{seed}:{index}")
    )
    return PoolSpec(
        agents=advertised,
        max_parallel=base.max_parallel,
        main_step_cost=base.main_step_cost,
        split_overhead=base.split_overhead,
        name=f"{base.name}-v{index}",
        kinds=tuple(sorted({k for a in advertised for k in a.kinds if k != WILDCARD_KIND})),
        truth=truth if truth != advertised else None,
    )


def pool_variants(base: PoolSpec, n: int, seed: int) -> list[PoolSpec]:
    """``n`` variants of ``base`` (see the module docstring), deterministic given ``seed``.

    Every kind ``base`` covers (the wildcard ``"*"`` included) stays covered in each variant,
    as advertised and as truly behaving, so every task valid on ``base`` is valid on each.
    """
    if n < 0:
        raise ConfigError(f"the number of pool variants must be >= 0, got {n}")
    return [pool_variant(base, i, seed) for i in range(1, n + 1)]


def deviations(pool: PoolSpec) -> dict[str, Deviation]:
    """Per agent of ``pool``, how its truth departs from its advertisement, read back from
    the profiles of the kinds it gets wrong (for reports and tests): SLOWER when each of them
    is slower, BETTER when each is faster, FLAKIER when each has the advertised speed but
    fails more or spreads more, MIXED otherwise; HONEST when nothing differs (always, for a
    pool without truth)."""
    truth = pool.true_spec().agents
    out: dict[str, Deviation] = {}
    for adv, true in zip(pool.agents, truth, strict=True):
        wrong = [(p, true.kinds[k]) for k, p in adv.kinds.items() if true.kinds[k] != p]
        if not wrong:
            out[adv.name] = Deviation.HONEST
        elif all(t.speed < a.speed for a, t in wrong):
            out[adv.name] = Deviation.SLOWER
        elif all(t.speed > a.speed for a, t in wrong):
            out[adv.name] = Deviation.BETTER
        elif all(
            t.speed == a.speed and (t.success < a.success or t.noise > a.noise) for a, t in wrong
        ):
            out[adv.name] = Deviation.FLAKIER
        else:
            out[adv.name] = Deviation.MIXED
    return out


__all__ = [
    "MIN_TRUE_SUCCESS",
    "WRONG_WAYS",
    "Deviation",
    "VariantAgent",
    "deviations",
    "pool_variant",
    "pool_variants",
    "variant_agents",
]
