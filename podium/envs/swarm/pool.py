"""The frozen sub-agent pool as a pure function: (profile, agent, kind, work, seed) -> outcome.

The simulator, the distributed ``subagent_svc`` and tests all call :meth:`SubagentPool.sample`
so a given execution seed yields the same duration and success everywhere. The three uniforms
an execution needs come from SplitMix64 (Steele et al., 2014) run on the 64-bit seed: a few
integer operations, identical on every platform and easy to re-implement in another language,
whereas constructing a seeded ``random.Random`` or numpy generator per execution costs more
than the rest of an environment step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from podium.envs.swarm.spec import SPLIT_FACTORS, KindProfile, PoolSpec, Subtask
from podium.errors import SpecError


@dataclass(frozen=True, slots=True)
class ExecutionSample:
    """What one simulated sub-agent execution did."""

    duration: float
    """Simulated time it ran."""
    success: bool
    """Whether it produced a usable result."""


_MASK64 = (1 << 64) - 1
_TWO_PI = 2.0 * math.pi
_INV_2_53 = 1.0 / (1 << 53)


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit bijection whose every output bit depends on every input
    bit (for hashing several small integers into one well-spread seed)."""
    z = (x + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def splitmix64_uniforms(seed: int) -> tuple[float, float, float]:
    """Three uniforms in [0, 1) from SplitMix64 seeded with ``seed`` (taken modulo 2^64)."""
    x = seed & _MASK64
    out: list[float] = []
    for _ in range(3):
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        out.append((z >> 11) * _INV_2_53)
    return out[0], out[1], out[2]


def sample_execution(profile: KindProfile, work: float, seed: int) -> ExecutionSample:
    """Draw one execution: duration = work / speed × LogNormal(−σ²/2, σ), success ~ Bernoulli.

    The lognormal factor has mean one (μ = −σ²/2), so an agent of speed s takes work / s on
    average as the spec promises, and σ = 0 gives exactly work / s. The standard normal comes
    from Box–Muller on the first two uniforms, success from the third, so the success draw
    does not depend on σ.
    """
    u1, u2, u3 = splitmix64_uniforms(seed)
    sigma = profile.noise
    if sigma > 0:
        z = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(_TWO_PI * u2)
        factor = math.exp(sigma * z - 0.5 * sigma * sigma)
    else:
        factor = 1.0
    return ExecutionSample(duration=work / profile.speed * factor, success=u3 < profile.success)


def merge_work_factor(planned: PoolSpec, true: PoolSpec) -> float:
    """How many times more work a merge really is than the planners' pool says: ``true``'s
    ``split_overhead`` over ``planned``'s.

    A split's merge is planned as ``split_overhead × work`` of the pool every planner reads;
    the sub-agent doing it takes what the true pool's overhead says (a pool whose merges
    cost more than advertised, or a drift that makes them costlier, :mod:`podium.envs.swarm.
    drift`). Nothing a planner reads shows it: the store sees only a slower execution.
    """
    if true.split_overhead == planned.split_overhead:
        return 1.0
    if planned.split_overhead <= 0:
        raise SpecError(
            f"pool {planned.name!r} plans merges as free (split_overhead 0); a true "
            f"split_overhead of {true.split_overhead:g} cannot scale them"
        )
    return true.split_overhead / planned.split_overhead


class SubagentPool:
    """A :class:`PoolSpec` with its (agent, kind) profiles resolved for fast lookups."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.agent_names: tuple[str, ...] = spec.agent_names()
        self.agent_index: dict[str, int] = {n: i for i, n in enumerate(self.agent_names)}
        self._profiles: dict[tuple[int, str], KindProfile | None] = {}

    @property
    def num_agents(self) -> int:
        """Number of agent kinds (the agent axis of the action space)."""
        return len(self.agent_names)

    def profile(self, agent: int | str, kind: str) -> KindProfile | None:
        """Profile of ``agent`` (index or name) on ``kind``, None if it cannot do it."""
        a = self.agent_index[agent] if isinstance(agent, str) else agent
        key = (a, kind)
        try:
            return self._profiles[key]
        except KeyError:
            prof = self.spec.agents[a].profile(kind)
            self._profiles[key] = prof
            return prof

    def can_do(self, agent: int | str, kind: str) -> bool:
        """Whether ``agent`` may be given ``kind`` (a zero-success profile still counts: it
        is a legal, if hopeless, choice the policy must learn to avoid)."""
        return self.profile(agent, kind) is not None

    def sample(
        self, agent: int | str, kind: str, work: float, seed: int | random.Random
    ) -> ExecutionSample:
        """Simulate one execution of ``work`` units of ``kind`` on ``agent``.

        Pure and deterministic in its arguments: an int seed always gives the same result.
        A ``random.Random`` is accepted for convenience and consumed for one 63-bit seed.
        """
        prof = self.profile(agent, kind)
        if prof is None:
            raise SpecError(f"agent {self.agent_names[self._idx(agent)]!r} cannot do kind {kind!r}")
        if work <= 0:
            raise SpecError(f"work must be > 0, got {work:g}")
        s = seed.getrandbits(63) if isinstance(seed, random.Random) else seed
        return sample_execution(prof, work, s)

    def _idx(self, agent: int | str) -> int:
        return self.agent_index[agent] if isinstance(agent, str) else agent

    def expected_duration(self, agent: int | str, kind: str, work: float) -> float:
        """Mean duration of one execution (inf if the agent cannot do the kind)."""
        prof = self.profile(agent, kind)
        return math.inf if prof is None else work / prof.speed

    def expected_time_to_success(self, agent: int | str, kind: str, work: float) -> float:
        """Mean total time until a success when retrying on the same agent (geometric)."""
        prof = self.profile(agent, kind)
        if prof is None or prof.success <= 0:
            return math.inf
        return work / prof.speed / prof.success

    def best_speed(self, kind: str) -> float:
        """Highest speed among agents that can do ``kind`` with non-zero success (0 if none)."""
        best = 0.0
        for a in range(self.num_agents):
            prof = self.profile(a, kind)
            if prof is not None and prof.success > 0 and prof.speed > best:
                best = prof.speed
        return best

    def fastest_agent(self, kind: str) -> int:
        """Agent with the highest speed for ``kind`` (ties: more reliable, then pool order)."""
        return self._argbest(kind, lambda p: (p.speed, p.success))

    def most_efficient_agent(self, kind: str) -> int:
        """Agent with the least expected time to success, speed × success (HEFT's choice)."""
        return self._argbest(kind, lambda p: (p.speed * p.success, p.speed))

    def _argbest(self, kind: str, key: object) -> int:
        best, best_key = -1, None
        for a in range(self.num_agents):
            prof = self.profile(a, kind)
            if prof is None or prof.success <= 0:
                continue
            k = key(prof)  # type: ignore[operator]
            if best_key is None or k > best_key:
                best, best_key = a, k
        if best < 0:
            raise SpecError(f"no agent in pool {self.spec.name!r} can do kind {kind!r}")
        return best

    def generalist(self) -> int | None:
        """The first agent declaring ``"*"`` (can do every kind), or None."""
        for i, a in enumerate(self.spec.agents):
            if "*" in a.kinds:
                return i
        return None

    def best_split_duration(self, sub: Subtask) -> tuple[float, int]:
        """Best expected duration of ``sub`` over k ∈ {1, 2, 4} at its best speed, and that k.

        For k > 1: work/(k·s) for the chunks (run in parallel) + split_overhead·work/s merge.
        """
        s = self.best_speed(sub.kind)
        if s <= 0:
            return math.inf, 1
        best, best_k = sub.work / s, 1
        if sub.splittable:
            for k in SPLIT_FACTORS[1:]:
                d = sub.work / (k * s) + self.spec.split_overhead * sub.work / s
                if d < best:
                    best, best_k = d, k
        return best, best_k
