"""The statistics behind rollout decisions: when a candidate has earned traffic, and when a
canary is hurting users.

Two tests, both sequential (the controller looks after every session, so a fixed-sample test
looked at repeatedly would false-alarm far above its level):

* :class:`AdvantageWindow` (shadow): the candidate *keeps its advantage* over ``window``
  consecutive paired comparisons d = candidate return - incumbent return on twins of live
  sessions. Passing needs the running mean of the window's first k comparisons to stay above
  zero for every k >= ``min_sessions`` and a one-sided lower confidence bound at the window's
  end above zero. A window whose running mean dips (or whose bound fails) restarts. A clearly
  worse candidate is stopped early by an always-valid mSPRT on every comparison since shadow
  began.
* :class:`GuardrailMonitor` (staged rollout): for each guardrail metric, the canary arm
  against the baseline arm, a one-sided mSPRT (Johari, Pekelis & Walsh 2017, "Always valid
  inference") on canary mean - baseline mean - margin, at a family-wise false-alarm rate
  ``alpha`` over all guardrails (Bonferroni: alpha / m each).

Variances are estimated from the data (plugged into the normal-mixture likelihood ratio),
so the always-valid guarantee is asymptotic; tests/podium/rollout/test_stats.py measures the
false-pass and false-alarm rates by Monte Carlo. Everything here is pure and checkpointable:
the state is sufficient statistics (:class:`Moments`) plus the current window's values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from podium.errors import ConfigError
from podium.rewards.detectors import DETECTORS
from podium.v1 import rollout_pb2, trajectory_pb2

# --------------------------------------------------------------------------- moments


@dataclass(frozen=True, slots=True)
class Moments:
    """Count, sum and sum of squares of a stream of values (mirrors ``rollout_pb2.Moments``)."""

    n: int = 0
    """How many values."""
    sum: float = 0.0
    """Their sum."""
    sum_sq: float = 0.0
    """The sum of their squares."""

    def add(self, x: float) -> Moments:
        """These moments with ``x`` added."""
        return Moments(self.n + 1, self.sum + x, self.sum_sq + x * x)

    def merge(self, other: Moments) -> Moments:
        """The moments of both streams together."""
        return Moments(self.n + other.n, self.sum + other.sum, self.sum_sq + other.sum_sq)

    @property
    def mean(self) -> float:
        """Sample mean (0 when empty)."""
        return self.sum / self.n if self.n else 0.0

    @property
    def variance(self) -> float:
        """Unbiased sample variance (0 with fewer than two values; never negative, although
        the sum-of-squares form can round below zero on near-constant data)."""
        if self.n < 2:
            return 0.0
        return max(0.0, (self.sum_sq - self.sum * self.sum / self.n) / (self.n - 1))

    def to_proto(self) -> rollout_pb2.Moments:
        """As the protobuf message."""
        return rollout_pb2.Moments(n=self.n, sum=self.sum, sum_sq=self.sum_sq)

    @classmethod
    def from_proto(cls, msg: rollout_pb2.Moments) -> Moments:
        """From the protobuf message."""
        return cls(int(msg.n), float(msg.sum), float(msg.sum_sq))


# --------------------------------------------------------------------------- mSPRT


def msprt_log_lr(delta: float, variance_of_mean: float, tau2: float) -> float:
    """Log of the normal-mixture sequential likelihood ratio (Johari, Pekelis & Walsh 2017).

    For an estimate ``delta`` ~ N(theta, V) (V = ``variance_of_mean``), the likelihood ratio
    of "theta ~ N(0, tau2)" against "theta = 0" is
    ∫ φ(delta; θ, V) φ(θ; 0, tau2) dθ / φ(delta; 0, V), in closed form
    0.5·log(V / (V + tau2)) + tau2·delta² / (2·V·(V + tau2)). Under theta = 0 it is a
    martingale in the sample size, so by Ville's inequality it ever exceeds 1/alpha with
    probability at most alpha: a test that may be looked at after every observation.
    Raises ValueError unless V > 0 and tau2 > 0.
    """
    if not variance_of_mean > 0 or not math.isfinite(variance_of_mean):
        raise ValueError(f"variance_of_mean must be finite and > 0, got {variance_of_mean}")
    if not tau2 > 0 or not math.isfinite(tau2):
        raise ValueError(f"tau2 must be finite and > 0, got {tau2}")
    v = variance_of_mean
    return 0.5 * math.log(v / (v + tau2)) + tau2 * delta * delta / (2.0 * v * (v + tau2))


def scaled_log_lr(delta: float, unit_variance: float, n_eff: float, tau: float) -> float:
    """:func:`msprt_log_lr` with the mixture scale in units of one observation's standard
    deviation: V = unit_variance / n_eff, tau2 = tau² · unit_variance. Unit-free, so one
    ``tau`` serves rates, ratios and milliseconds alike.

    Zero variance (every observation equal) is the limit of the formula: +inf when
    ``delta`` != 0 (a certain difference), the finite value 0.5·log(1/(1 + n_eff·tau²))
    when ``delta`` == 0.
    """
    if n_eff <= 0:
        return 0.0
    if unit_variance <= 0:
        return math.inf if delta != 0 else 0.5 * math.log(1.0 / (1.0 + n_eff * tau * tau))
    return msprt_log_lr(delta, unit_variance / n_eff, tau * tau * unit_variance)


def _z(alpha: float) -> float:
    """The standard normal quantile z_{1-alpha}."""
    return NormalDist().inv_cdf(1.0 - alpha)


def _check_alpha(where: str, alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"{where}.alpha: must be in (0, 1), got {alpha}")


def _check_tau(where: str, tau: float) -> None:
    if not (tau > 0 and math.isfinite(tau)):
        raise ConfigError(f"{where}.tau: must be a finite number > 0, got {tau}")


# --------------------------------------------------------------------------- shadow


@dataclass(frozen=True)
class AdvantageRule:
    """When a candidate "keeps its advantage" in shadow (see :class:`AdvantageWindow`)."""

    window: int = 500
    """W: consecutive paired comparisons the advantage must hold over (the seed's 500)."""
    min_sessions: int = 30
    """Comparisons in a window before its running mean is judged (the first few are noise)."""
    alpha: float = 0.05
    """False-pass rate of the whole shadow phase for a candidate no better than the incumbent
    (spent evenly over the windows it can begin, see :attr:`attempts`), and the level of the
    mSPRT that fails a worse one early."""
    max_sessions: int = 5000
    """Comparisons after which a candidate that has not passed fails (shadow must end)."""
    tau: float = 0.5
    """Scale of the mSPRT's normal mixture over the mean difference, in standard deviations
    of one comparison: the effect size it is most sensitive to (0.5: a medium effect)."""

    def __post_init__(self) -> None:
        where = "AdvantageRule"
        if self.min_sessions < 2:
            raise ConfigError(f"{where}.min_sessions: must be >= 2, got {self.min_sessions}")
        if self.window < self.min_sessions:
            raise ConfigError(
                f"{where}.window: must be >= min_sessions ({self.min_sessions}), got {self.window}"
            )
        if self.max_sessions < self.window:
            raise ConfigError(
                f"{where}.max_sessions: must be >= window ({self.window}), got {self.max_sessions}"
            )
        _check_alpha(where, self.alpha)
        _check_tau(where, self.tau)

    @property
    def attempts(self) -> int:
        """Most windows one shadow phase can begin that could still be completed: a window
        that restarts has used at least ``min_sessions`` comparisons, so at most
        1 + (max_sessions - window) // min_sessions windows start early enough to fill."""
        return 1 + (self.max_sessions - self.window) // self.min_sessions

    @property
    def z(self) -> float:
        """Quantile of the window's lower confidence bound: z_{1 - alpha / attempts}.

        Why not z_{1 - alpha}: the window restarts whenever its running mean dips, so an
        equal candidate gets many tries, and the tries that survive to the end are the lucky
        ones. Each try's bound is computed on W fresh comparisons after a stopping time, so
        P(that bound > 0) <= alpha / attempts whatever the selection, and by the union bound
        the whole phase passes an equal candidate with probability at most alpha."""
        return _z(self.alpha / self.attempts)


@dataclass(frozen=True)
class Verdict:
    """What the evidence says after one more comparison."""

    passed: bool
    """The candidate kept its advantage: promote."""
    failed: bool
    """The candidate is worse, or ran out of sessions: reject."""
    figures: dict[str, float]
    """Named figures (sessions, window, running_mean, min_running_mean, lower_bound, ...)."""
    summary: str
    """One line a person reads."""

    def evidence(self) -> rollout_pb2.Evidence:
        """As the ``Evidence`` of a transition."""
        ev = rollout_pb2.Evidence(summary=self.summary)
        ev.figures.update(self.figures)
        return ev


class AdvantageWindow:
    """The shadow test, one paired comparison at a time.

    ``add(d)`` takes d = candidate return - incumbent return on one twin pair and returns a
    :class:`Verdict`:

    * *passed* when the current window holds ``rule.window`` comparisons, the running mean of
      its first k stayed > 0 for every k >= ``rule.min_sessions`` (checked as each arrives),
      and its one-sided lower bound mean - z·s/sqrt(W) > 0 (z = :attr:`AdvantageRule.z`,
      corrected for the window's restarts);
    * the window *restarts* empty from the next comparison (``restarts`` += 1) when its running
      mean falls to <= 0 at some k >= ``min_sessions``, or when it is full and the bound is
      <= 0;
    * *failed* when every comparison since shadow began (``total``, at least
      ``min_sessions``) has a negative mean and the always-valid mSPRT says so at level
      ``alpha`` (the candidate is worse: stop now), or when ``total.n`` reaches
      ``max_sessions`` without a pass.

    After a pass the next ``add`` starts a fresh window (no restart counted).
    """

    def __init__(
        self,
        rule: AdvantageRule,
        window: Sequence[float] = (),
        total: Moments | None = None,
        restarts: int = 0,
    ) -> None:
        self.rule = rule
        self.total = total if total is not None else Moments()
        self.restarts = restarts
        self._window: list[float] = []
        self._sum = 0.0
        self._min_mean = math.inf
        # Replaying the window through the same arithmetic makes a restored window decide
        # exactly like the one that was checkpointed.
        for d in window:
            self._push(float(d))

    @property
    def window(self) -> tuple[float, ...]:
        """The current window's comparisons, in order."""
        return tuple(self._window)

    def _push(self, d: float) -> None:
        self._window.append(d)
        self._sum += d
        k = len(self._window)
        if k >= self.rule.min_sessions:
            self._min_mean = min(self._min_mean, self._sum / k)

    def _restart(self) -> None:
        self._window.clear()
        self._sum = 0.0
        self._min_mean = math.inf

    def _lower_bound(self) -> float:
        k = len(self._window)
        mean = self._sum / k
        if k < 2:
            return -math.inf
        var = math.fsum((x - mean) ** 2 for x in self._window) / (k - 1)
        return mean - self.rule.z * math.sqrt(var / k)

    def _worse(self) -> tuple[bool, float]:
        """(mSPRT says the mean of all comparisons is < 0, its log likelihood ratio)."""
        t = self.total
        if t.n < self.rule.min_sessions:
            return False, 0.0
        if t.mean >= 0:  # one-sided: no evidence that it is worse
            return False, 0.0
        llr = scaled_log_lr(t.mean, t.variance, t.n, self.rule.tau)
        return llr >= math.log(1.0 / self.rule.alpha), llr

    def _judge_window(self) -> tuple[bool, str, dict[str, float]]:
        """(passed, what happened, figures) of the current window after a comparison; a
        window that lost its advantage restarts here."""
        k = len(self._window)
        running = self._sum / k
        min_mean = self._min_mean if math.isfinite(self._min_mean) else running
        figures = {"window": float(k), "running_mean": running, "min_running_mean": min_mean}
        if k >= self.rule.min_sessions and running <= 0:
            self._restart()
            self.restarts += 1
            return False, f"running mean {running:+.4g} <= 0 at {k}: window restarts", figures
        if k < self.rule.window:
            return False, f"window {k}/{self.rule.window}, running mean {running:+.4g}", figures
        # The bound is judged (and shown) on a full window only.
        lower = figures["lower_bound"] = self._lower_bound()
        if lower > 0:
            return True, f"kept its advantage over {k} sessions, lower bound {lower:+.4g}", figures
        self._restart()
        self.restarts += 1
        return False, f"window full but lower bound {lower:+.4g} <= 0: window restarts", figures

    def add(self, d: float) -> Verdict:
        """Count one comparison (candidate return - incumbent return) and judge."""
        if not math.isfinite(d):
            raise ValueError(f"paired difference must be finite, got {d}")
        if len(self._window) >= self.rule.window:  # the previous add passed
            self._restart()
        self.total = self.total.add(d)
        self._push(d)
        passed, note, figures = self._judge_window()
        worse, llr = self._worse()
        exhausted = self.total.n >= self.rule.max_sessions
        failed = not passed and (worse or exhausted)
        if failed and worse:
            note = f"worse: mean {self.total.mean:+.4g} over {self.total.n}, mSPRT log LR {llr:.3g}"
        elif failed:
            note = f"no lasting advantage within {self.rule.max_sessions} sessions"
        figures |= {
            "sessions": float(self.total.n),
            "mean": self.total.mean,
            "z": self.rule.z,
            "msprt_log_lr": llr,
            "msprt_threshold": math.log(1.0 / self.rule.alpha),
            "restarts": float(self.restarts),
        }
        return Verdict(passed=passed, failed=failed, figures=figures, summary=note)

    def to_checkpoint(self, cp: rollout_pb2.ControllerCheckpoint) -> None:
        """Write this window's state into ``cp`` (shadow_window, shadow_total,
        shadow_restarts), replacing what was there."""
        del cp.shadow_window[:]
        cp.shadow_window.extend(self._window)
        cp.shadow_total.CopyFrom(self.total.to_proto())
        cp.shadow_restarts = self.restarts

    @classmethod
    def from_checkpoint(
        cls, rule: AdvantageRule, cp: rollout_pb2.ControllerCheckpoint
    ) -> AdvantageWindow:
        """The window :meth:`to_checkpoint` wrote: it decides exactly as the original."""
        return cls(
            rule,
            window=list(cp.shadow_window),
            total=Moments.from_proto(cp.shadow_total),
            restarts=int(cp.shadow_restarts),
        )


# --------------------------------------------------------------------------- guardrails


@dataclass(frozen=True)
class Guardrail:
    """One metric the canary must not worsen against the baseline arm (higher is worse)."""

    name: str
    """Metric name, a key of :func:`podium.rollout.metrics.session_metrics`."""
    margin: float
    """Tolerated worsening before the test counts against the canary."""
    relative: bool
    """Whether ``margin`` is a fraction of the baseline mean (else absolute)."""
    floor: float = 0.0
    """The smallest margin, in the metric's units, when ``margin`` is relative: a fraction of
    a tiny baseline is no tolerance at all (a rule engine decides in about 0.3 ms, a learned
    network in a few ms, both far inside any decision budget)."""

    def margin_abs(self, baseline_mean: float) -> float:
        """The margin in the metric's units."""
        if self.relative:
            return max(self.floor, self.margin * abs(baseline_mean))
        return self.margin


@dataclass(frozen=True)
class GuardrailConfig:
    """How guardrails are tested."""

    alpha: float = 0.05
    """Family-wise false-alarm rate over all guardrails of one stage (each gets alpha / m,
    Bonferroni over the m guardrails)."""
    min_sessions: int = 20
    """Sessions per arm before any guardrail is tested."""
    tau: float = 0.25
    """Scale of the mSPRT's normal mixture over the difference, in standard deviations of one
    session's metric (pooled over both arms): the worsening it is tuned to. Not larger: at
    the first looks a rare event's rate on a few canary sessions has a heavier upper tail
    than the normal model, and a wide mixture bets on those looks (0.5 measured a 6%
    family-wise false-alarm rate at zero margins, 0.25 under 3%); detection of a large
    worsening is barely slower (incomplete 5% -> 30% at the 1% stage: median 36, at most
    61 canary sessions)."""

    def __post_init__(self) -> None:
        _check_alpha("GuardrailConfig", self.alpha)
        _check_tau("GuardrailConfig", self.tau)
        if self.min_sessions < 2:
            raise ConfigError(
                f"GuardrailConfig.min_sessions: must be >= 2, got {self.min_sessions}"
            )


DECISION_MS_FLOOR = 50.0
"""The decision-latency guardrail tolerates at least this many milliseconds of p99 worsening:
the first learned canary after the cpls cold start is compared with a rule engine that
decides in well under a millisecond (measured: 5.7 ms learned vs 0.3 ms cpls p99), and 50%
of that would stop every learned policy for being a network at all."""

DEFAULT_GUARDRAILS: tuple[Guardrail, ...] = (
    Guardrail("incomplete", 0.02, relative=False),
    Guardrail("failed", 0.02, relative=False),
    Guardrail("latency_ratio", 0.05, relative=True),
    Guardrail("decision_ms_p99", 0.5, relative=True, floor=DECISION_MS_FLOOR),
    *(Guardrail(f"detector:{name}", 0.02, relative=False) for name in DETECTORS),
)
"""Completion, failed sessions, latency/bound, decision latency p99 and every anti-hacking
detector's firing rate."""


@dataclass
class _Arms:
    canary: Moments = field(default_factory=Moments)
    baseline: Moments = field(default_factory=Moments)


class GuardrailMonitor:
    """Guardrails of one stage: canary against baseline, tested after every session.

    A guardrail breaches when canary_mean - baseline_mean - margin_abs > 0 and its one-sided
    mSPRT log likelihood ratio is >= log(m / alpha) (m guardrails), once both arms have
    ``min_sessions``. The reading's statistic is that one-sided statistic: 0 while the
    difference is within the margin (or either arm is short of ``min_sessions``). The variance is the pooled variance of both arms together (the
    variance under "no difference", as in the pooled two-proportion test), so a rare event
    that the baseline never showed still has a variance.
    """

    def __init__(
        self,
        guardrails: Sequence[Guardrail] = DEFAULT_GUARDRAILS,
        config: GuardrailConfig | None = None,
        states: Iterable[rollout_pb2.GuardrailState] = (),
    ) -> None:
        names = [g.name for g in guardrails]
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"guardrails: names must be distinct and non-empty, got {names}")
        self.guardrails = tuple(guardrails)
        self.config = config or GuardrailConfig()
        self._arms = {g.name: _Arms() for g in self.guardrails}
        # A guardrail dropped from the configuration since the checkpoint is forgotten.
        for st in states:
            if st.name in self._arms:
                self._arms[st.name] = _Arms(
                    Moments.from_proto(st.canary), Moments.from_proto(st.baseline)
                )

    @property
    def threshold(self) -> float:
        """log(m / alpha): each guardrail's mSPRT threshold."""
        return math.log(len(self.guardrails) / self.config.alpha)

    def add(self, role: int, metrics: Mapping[str, float]) -> None:
        """Count one session of arm ``role`` (CANARY or BASELINE; other roles are ignored).
        A metric missing from ``metrics`` is not counted for that guardrail; a non-finite one
        is refused (ValueError naming it) before anything is counted."""
        if role not in (trajectory_pb2.ARM_ROLE_CANARY, trajectory_pb2.ARM_ROLE_BASELINE):
            return
        for g in self.guardrails:
            x = metrics.get(g.name)
            if x is not None and not math.isfinite(x):
                raise ValueError(f"metric {g.name!r}: must be finite, got {x}")
        canary = role == trajectory_pb2.ARM_ROLE_CANARY
        for g in self.guardrails:
            x = metrics.get(g.name)
            if x is None:
                continue
            arms = self._arms[g.name]
            if canary:
                arms.canary = arms.canary.add(float(x))
            else:
                arms.baseline = arms.baseline.add(float(x))

    def _test(self, g: Guardrail) -> tuple[float, float, bool]:
        """(margin_abs, log likelihood ratio, breached) of one guardrail now."""
        arms = self._arms[g.name]
        c, b = arms.canary, arms.baseline
        margin = g.margin_abs(b.mean)
        if c.n < self.config.min_sessions or b.n < self.config.min_sessions:
            return margin, 0.0, False
        delta = c.mean - b.mean - margin
        if delta <= 0:  # one-sided: a canary no worse than the margin has no case against it
            return margin, 0.0, False
        n_eff = 1.0 / (1.0 / c.n + 1.0 / b.n)
        stat = scaled_log_lr(delta, c.merge(b).variance, n_eff, self.config.tau)
        return margin, stat, stat >= self.threshold

    def reading(self, g: Guardrail) -> rollout_pb2.GuardrailReading:
        """One guardrail's reading now."""
        arms = self._arms[g.name]
        margin, stat, breached = self._test(g)
        return rollout_pb2.GuardrailReading(
            name=g.name,
            canary_mean=arms.canary.mean,
            baseline_mean=arms.baseline.mean,
            canary_n=arms.canary.n,
            baseline_n=arms.baseline.n,
            statistic=stat,
            threshold=self.threshold,
            breached=breached,
            margin=margin,
        )

    def readings(self) -> list[rollout_pb2.GuardrailReading]:
        """Every guardrail's reading, in configuration order."""
        return [self.reading(g) for g in self.guardrails]

    def breached(self) -> list[rollout_pb2.GuardrailReading]:
        """The readings that breached (empty: the canary is fine so far). Cheap enough to
        call after every session: only breached guardrails become messages."""
        return [self.reading(g) for g in self.guardrails if self._test(g)[2]]

    def to_proto(self) -> list[rollout_pb2.GuardrailState]:
        """The statistics, for the controller's checkpoint."""
        return [
            rollout_pb2.GuardrailState(
                name=g.name,
                canary=self._arms[g.name].canary.to_proto(),
                baseline=self._arms[g.name].baseline.to_proto(),
            )
            for g in self.guardrails
        ]


__all__ = [
    "DEFAULT_GUARDRAILS",
    "AdvantageRule",
    "AdvantageWindow",
    "Guardrail",
    "GuardrailConfig",
    "GuardrailMonitor",
    "Moments",
    "Verdict",
    "msprt_log_lr",
    "scaled_log_lr",
]
