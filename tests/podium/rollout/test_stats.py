"""The rollout statistics against slow references and by Monte Carlo: the shadow window's
false-pass rate, the guardrails' family-wise false-alarm rate, detection delays."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from podium.errors import ConfigError
from podium.rewards import DETECTORS
from podium.rollout import (
    DEFAULT_GUARDRAILS,
    AdvantageRule,
    AdvantageWindow,
    Guardrail,
    GuardrailConfig,
    GuardrailMonitor,
    Moments,
    Verdict,
    msprt_log_lr,
)
from podium.rollout.stats import DECISION_MS_FLOOR, scaled_log_lr
from podium.v1 import rollout_pb2, trajectory_pb2

CANARY = trajectory_pb2.ARM_ROLE_CANARY
BASELINE = trajectory_pb2.ARM_ROLE_BASELINE

# --------------------------------------------------------------------------- references


def log_normal_pdf(x: np.ndarray, mean: float | np.ndarray, var: float) -> np.ndarray:
    return -0.5 * np.log(2 * math.pi * var) - (x - mean) ** 2 / (2 * var)


def slow_mixture_log_lr(delta: float, v: float, tau2: float) -> float:
    """∫ φ(delta; θ, V) φ(θ; 0, τ²) dθ / φ(delta; 0, V) by the trapezoid rule on a wide grid."""
    sd = math.sqrt(tau2)
    theta = np.linspace(-12 * sd + delta / 2, 12 * sd + delta / 2, 200_001)
    log_f = log_normal_pdf(np.array(delta), theta, v) + log_normal_pdf(theta, 0.0, tau2)
    peak = float(log_f.max())
    integral = float(np.trapezoid(np.exp(log_f - peak), theta))
    return peak + math.log(integral) - float(log_normal_pdf(np.array(delta), 0.0, v))


def slow_data_log_lr(xs: list[float], sigma2: float, tau2: float) -> float:
    """The mixture LR from the raw observations' likelihoods (not through their mean)."""
    x = np.array(xs)
    sd = math.sqrt(tau2)
    theta = np.linspace(-10 * sd, 10 * sd, 100_001)
    log_alt = np.array([log_normal_pdf(x, t, sigma2).sum() for t in theta[::50]])
    grid = theta[::50]
    log_alt = log_alt + log_normal_pdf(grid, 0.0, tau2)
    peak = float(log_alt.max())
    log_mix = peak + math.log(float(np.trapezoid(np.exp(log_alt - peak), grid)))
    return log_mix - float(log_normal_pdf(x, 0.0, sigma2).sum())


@pytest.mark.parametrize(
    ("delta", "v", "tau2"),
    [(0.0, 1.0, 1.0), (0.3, 0.01, 0.25), (-0.8, 0.04, 0.1), (2.0, 0.5, 3.0), (1e-3, 1e-4, 1e-2)],
)
def test_msprt_log_lr_matches_numerical_integration(delta: float, v: float, tau2: float) -> None:
    assert msprt_log_lr(delta, v, tau2) == pytest.approx(
        slow_mixture_log_lr(delta, v, tau2), abs=1e-6
    )


def test_msprt_log_lr_is_the_lr_of_the_data() -> None:
    rng = random.Random(3)
    xs = [rng.gauss(0.2, 1.0) for _ in range(40)]
    sigma2, tau2 = 1.0, 0.25
    mean = sum(xs) / len(xs)
    assert msprt_log_lr(mean, sigma2 / len(xs), tau2) == pytest.approx(
        slow_data_log_lr(xs, sigma2, tau2), abs=1e-3
    )


def test_msprt_log_lr_refuses_nonpositive_variances() -> None:
    with pytest.raises(ValueError, match="variance_of_mean"):
        msprt_log_lr(0.1, 0.0, 1.0)
    with pytest.raises(ValueError, match="tau2"):
        msprt_log_lr(0.1, 1.0, -1.0)


def test_scaled_log_lr_limits_at_zero_variance() -> None:
    assert scaled_log_lr(0.1, 0.0, 50, 0.5) == math.inf
    assert scaled_log_lr(0.0, 0.0, 50, 0.5) == pytest.approx(0.5 * math.log(1 / (1 + 50 * 0.25)))
    # It is the limit of the formula as the variance shrinks.
    assert scaled_log_lr(0.0, 1e-12, 50, 0.5) == pytest.approx(scaled_log_lr(0.0, 0.0, 50, 0.5))


def test_moments_against_numpy_and_proto() -> None:
    xs = [random.Random(1).uniform(-3, 5) for _ in range(1)] + [1.5, 2.5, -0.25, 7.0]
    m = Moments()
    for x in xs:
        m = m.add(x)
    assert m.n == len(xs)
    assert m.mean == pytest.approx(float(np.mean(xs)))
    assert m.variance == pytest.approx(float(np.var(xs, ddof=1)))
    assert Moments.from_proto(m.to_proto()) == m
    assert Moments().mean == 0.0 and Moments().add(3.0).variance == 0.0
    assert m.merge(Moments().add(1.0)) == m.add(1.0)


# --------------------------------------------------------------------------- shadow


def run_window(
    window: AdvantageWindow, draw: Callable[[], float], limit: int
) -> tuple[Verdict, int]:
    """Feed comparisons until a verdict (or ``limit``); (the last verdict, comparisons fed)."""
    v = window.add(draw())
    n = 1
    while not (v.passed or v.failed) and n < limit:
        v = window.add(draw())
        n += 1
    return v, n


def test_clearly_better_candidate_passes_within_the_window() -> None:
    rule = AdvantageRule()
    for seed in range(20):
        rng = random.Random(seed)
        v, n = run_window(
            AdvantageWindow(rule), functools.partial(rng.gauss, 0.5, 1.0), rule.max_sessions
        )
        assert v.passed and not v.failed
        assert n == rule.window  # a 0.5 sd advantage never dips: one window suffices
        assert v.figures["lower_bound"] > 0 and v.figures["min_running_mean"] > 0
        assert v.evidence().figures["sessions"] == rule.window


def test_window_restarts_when_the_running_mean_dips() -> None:
    rule = AdvantageRule(window=100, min_sessions=10, max_sessions=1000)
    w = AdvantageWindow(rule)
    dip = [0.5 if i % 2 else -1.5 for i in range(10)]  # mean -0.5: a dip, not yet "worse"
    for x in dip[:9]:
        assert not w.add(x).passed  # below min_sessions: not judged yet
    assert w.restarts == 0 and len(w.window) == 9
    v = w.add(dip[9])  # k = 10, running mean -0.5 <= 0
    assert w.restarts == 1 and w.window == ()
    assert "restarts" in v.summary and not v.failed
    # A good stretch after a dip passes on its own window: the dip is forgotten.
    for i in range(100):
        v = w.add(1.0 + (0.5 if i % 2 else -0.5))
    assert v.passed and w.restarts == 1


def test_window_restarts_when_full_and_the_bound_fails() -> None:
    rule = AdvantageRule(window=50, min_sessions=10, max_sessions=1000)
    w = AdvantageWindow(rule)
    # Mean 0.05, sd ~1: positive throughout (k >= 10) but far from a significant bound.
    xs = [1.05 if i % 2 == 0 else -0.95 for i in range(50)]
    verdicts = [w.add(x) for x in xs]
    assert not any(v.passed for v in verdicts)
    assert verdicts[-1].figures["lower_bound"] < 0
    assert w.restarts == 1 and w.window == ()


def test_equal_candidates_rarely_pass_monte_carlo() -> None:
    # Zero-mean differences: the false-pass rate over the whole shadow phase (until a
    # verdict or max_sessions) must be <= alpha. A window that restarts on every dip gives
    # an equal candidate dozens of tries; the bound's z (corrected for them) keeps the
    # phase at alpha. With z_{1-alpha} this rate measures ~0.12.
    rule = AdvantageRule(window=100, min_sessions=10, max_sessions=1500)
    runs, passed, failed_early = 400, 0, 0
    for seed in range(runs):
        rng = random.Random(10_000 + seed)
        v, n = run_window(
            AdvantageWindow(rule), functools.partial(rng.gauss, 0.0, 1.0), rule.max_sessions
        )
        passed += v.passed
        failed_early += v.failed and n < rule.max_sessions
    assert passed / runs <= rule.alpha + 0.02, passed
    assert failed_early / runs <= rule.alpha + 0.02, failed_early  # the mSPRT's level


def test_default_rule_z_is_corrected_for_restarts() -> None:
    rule = AdvantageRule()
    assert rule.attempts == 1 + (5000 - 500) // 30
    assert rule.z == pytest.approx(3.40, abs=0.02)


def test_clearly_worse_candidate_fails_fast() -> None:
    rule = AdvantageRule()
    lengths = []
    for seed in range(20):
        rng = random.Random(seed)
        v, n = run_window(
            AdvantageWindow(rule), functools.partial(rng.gauss, -0.5, 1.0), rule.max_sessions
        )
        assert v.failed and not v.passed
        assert v.figures["msprt_log_lr"] >= math.log(1 / rule.alpha)
        lengths.append(n)
    assert max(lengths) <= 150, lengths  # measured: median ~35, max ~115


def test_identical_twins_never_pass_and_never_fail_early() -> None:
    # An incumbent against itself: every difference is exactly 0 (zero variance).
    rule = AdvantageRule(window=100, min_sessions=10, max_sessions=400)
    v, n = run_window(AdvantageWindow(rule), lambda: 0.0, rule.max_sessions)
    assert not v.passed and v.failed and n == rule.max_sessions


def test_constant_negative_differences_fail_at_min_sessions() -> None:
    rule = AdvantageRule()
    v, n = run_window(AdvantageWindow(rule), lambda: -0.1, rule.max_sessions)
    assert v.failed and n == rule.min_sessions


def test_checkpoint_round_trip_decides_identically() -> None:
    rule = AdvantageRule(window=200, min_sessions=20, max_sessions=2000)
    rng = random.Random(7)
    xs = [rng.gauss(0.12, 1.0) for _ in range(2000)]
    original = AdvantageWindow(rule)
    for x in xs[:333]:
        original.add(x)
    cp = rollout_pb2.ControllerCheckpoint()
    original.to_checkpoint(cp)
    restored = AdvantageWindow.from_checkpoint(
        rule, rollout_pb2.ControllerCheckpoint.FromString(cp.SerializeToString())
    )
    assert restored.window == original.window and restored.total == original.total
    assert restored.restarts == original.restarts
    for x in xs[333:]:
        a, b = original.add(x), restored.add(x)
        assert a == b
        if a.passed or a.failed:
            break
    assert a.passed or a.failed


def test_rule_validation_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"AdvantageRule\.window"):
        AdvantageRule(window=10, min_sessions=30)
    with pytest.raises(ConfigError, match=r"AdvantageRule\.alpha"):
        AdvantageRule(alpha=1.5)
    with pytest.raises(ConfigError, match=r"AdvantageRule\.max_sessions"):
        AdvantageRule(max_sessions=100)
    with pytest.raises(ConfigError, match=r"GuardrailConfig\.tau"):
        GuardrailConfig(tau=0.0)
    with pytest.raises(ValueError, match="finite"):
        AdvantageWindow(AdvantageRule()).add(math.nan)


# --------------------------------------------------------------------------- guardrails


def session(rng: random.Random, incomplete_rate: float = 0.05) -> dict[str, float]:
    """One simulated session's guardrail metrics (shapes like session_metrics': rates,
    a capped ratio, a skewed latency)."""
    incomplete = rng.random() < incomplete_rate
    m = {
        "incomplete": float(incomplete),
        "failed": float(incomplete and rng.random() < 0.5),
        "latency_ratio": 4.0 if incomplete else min(4.0, 1.0 + rng.expovariate(1 / 0.3)),
        "decision_ms_p99": rng.lognormvariate(math.log(3.0), 0.5),
    }
    for name in DETECTORS:
        m[f"detector:{name}"] = float(rng.random() < 0.03)
    return m


def stage_alarms(
    guardrails: tuple[Guardrail, ...], stages: int, sessions: int, canary_share: float
) -> int:
    """Simulated stages with no difference between the arms that raised any alarm (checked
    after every session, as the controller does)."""
    alarms = 0
    for seed in range(stages):
        rng = random.Random(seed)
        monitor = GuardrailMonitor(guardrails)
        for _ in range(sessions):
            monitor.add(CANARY if rng.random() < canary_share else BASELINE, session(rng))
            if monitor.breached():
                alarms += 1
                break
    return alarms


def test_default_guardrails_cover_every_detector() -> None:
    names = {g.name for g in DEFAULT_GUARDRAILS}
    assert {"incomplete", "failed", "latency_ratio", "decision_ms_p99"} <= names
    assert {f"detector:{d}" for d in DETECTORS} <= names
    assert len(names) == 4 + len(DETECTORS)


@pytest.mark.slow
def test_no_difference_family_wise_false_alarms_at_most_alpha() -> None:
    # The 1% stage (canary 1 : baseline 5), checked after every session, 1000-1200 sessions.
    alpha = GuardrailConfig().alpha
    # The shipped guardrails: measured 1/300 stages.
    stages = 80
    alarms = stage_alarms(DEFAULT_GUARDRAILS, stages, 1200, 1 / 6)
    assert alarms / stages <= alpha, alarms
    # The boundary of the null (zero margins: the canary exactly as good), with 3%-rare
    # events on few canary sessions, the hardest case for a normal model: measured 8/300.
    stages = 150
    zero = tuple(Guardrail(g.name, 0.0, g.relative) for g in DEFAULT_GUARDRAILS)
    alarms = stage_alarms(zero, stages, 1000, 1 / 6)
    assert alarms / stages <= alpha + 0.02, alarms


def test_real_degradation_breaches_within_a_bounded_number_of_sessions() -> None:
    # Incomplete rate 5% -> 30% on the canary, at the 1% stage (1 canary : 5 baseline).
    delays = []
    for seed in range(25):
        rng = random.Random(500 + seed)
        monitor = GuardrailMonitor()
        canary_sessions = 0
        while not monitor.breached():
            if rng.random() < 1 / 6:
                canary_sessions += 1
                monitor.add(CANARY, session(rng, 0.30))
            else:
                monitor.add(BASELINE, session(rng, 0.05))
            assert canary_sessions <= 1000, "no breach"
        # Only what the degradation touches (failed and latency follow incompleteness).
        assert {r.name for r in monitor.breached()} <= {"incomplete", "failed", "latency_ratio"}
        delays.append(canary_sessions)
    # Before the stage could advance (stage_min_sessions = 200 canary sessions).
    # Measured: median 36, max 61 canary sessions; the stage needs 200 before it may advance.
    assert max(delays) <= 120, sorted(delays)


def test_breach_needs_both_arms_min_sessions() -> None:
    monitor = GuardrailMonitor(config=GuardrailConfig(min_sessions=20))
    bad = {"incomplete": 1.0}
    good = {"incomplete": 0.0}
    for _ in range(19):
        monitor.add(CANARY, bad)
        monitor.add(BASELINE, good)
    assert monitor.breached() == []
    assert monitor.readings()[0].statistic == 0.0
    monitor.add(BASELINE, good)
    assert monitor.breached() == []  # canary still at 19
    monitor.add(CANARY, bad)
    (reading,) = monitor.breached()
    assert reading.name == "incomplete" and reading.canary_n == 20 and reading.baseline_n == 20
    assert reading.statistic >= reading.threshold == pytest.approx(math.log(10 / 0.05))


def test_relative_margin_scales_with_the_baseline() -> None:
    g = Guardrail("latency_ratio", 0.05, relative=True)
    monitor = GuardrailMonitor([g], GuardrailConfig(min_sessions=2))
    rng = random.Random(0)
    # The canary 4% slower than baseline: inside a 5% relative margin, never a breach.
    for _ in range(3000):
        monitor.add(BASELINE, {"latency_ratio": 2.0 + rng.gauss(0, 0.01)})
        monitor.add(CANARY, {"latency_ratio": 2.08 + rng.gauss(0, 0.01)})
    (r,) = monitor.readings()
    assert r.margin == pytest.approx(0.1, rel=1e-2)
    assert not r.breached
    # 8% slower: outside it, a breach.
    monitor = GuardrailMonitor([g], GuardrailConfig(min_sessions=2))
    for _ in range(100):
        monitor.add(BASELINE, {"latency_ratio": 2.0 + rng.gauss(0, 0.01)})
        monitor.add(CANARY, {"latency_ratio": 2.16 + rng.gauss(0, 0.01)})
    assert [r.name for r in monitor.breached()] == ["latency_ratio"]
    # An absolute margin of the same number means something else entirely.
    assert Guardrail("x", 0.05, relative=False).margin_abs(2.0) == 0.05


def test_decision_latency_floor_lets_a_network_follow_a_rule_engine() -> None:
    """A learned canary (about 6 ms p99) against a rule-engine baseline (0.3 ms): 20 times
    slower, inside the 50 ms floor, no breach; a canary 80 ms slower breaches."""
    (g,) = [g for g in DEFAULT_GUARDRAILS if g.name == "decision_ms_p99"]
    assert g.margin_abs(0.3) == DECISION_MS_FLOOR and g.margin_abs(400.0) == 200.0
    rng = random.Random(3)
    for canary_ms, breach in ((6.0, False), (80.0, True)):
        monitor = GuardrailMonitor([g], GuardrailConfig(min_sessions=5))
        for _ in range(400):
            monitor.add(BASELINE, {"decision_ms_p99": 0.3 + abs(rng.gauss(0, 0.05))})
            monitor.add(CANARY, {"decision_ms_p99": canary_ms + abs(rng.gauss(0, 1.0))})
        assert bool(monitor.breached()) is breach, canary_ms


def test_better_canary_never_breaches() -> None:
    monitor = GuardrailMonitor()
    rng = random.Random(9)
    for _ in range(3000):
        monitor.add(CANARY, session(rng, 0.01))
        monitor.add(BASELINE, session(rng, 0.20))
    assert monitor.breached() == []


def test_other_roles_ignored_missing_metrics_skipped_bad_values_refused() -> None:
    monitor = GuardrailMonitor()
    monitor.add(trajectory_pb2.ARM_ROLE_LIVE, {"incomplete": 1.0})
    monitor.add(trajectory_pb2.ARM_ROLE_SHADOW, {"incomplete": 1.0})
    monitor.add(CANARY, {"incomplete": 1.0})
    by_name = {r.name: r for r in monitor.readings()}
    assert by_name["incomplete"].canary_n == 1 and by_name["failed"].canary_n == 0
    with pytest.raises(ValueError, match="'failed'"):
        monitor.add(CANARY, {"incomplete": 0.0, "failed": math.inf})
    assert {r.name: r for r in monitor.readings()}["incomplete"].canary_n == 1
    with pytest.raises(ConfigError, match="distinct"):
        GuardrailMonitor([Guardrail("a", 0, False), Guardrail("a", 0, False)])


def test_guardrail_state_round_trip() -> None:
    rng = random.Random(4)
    monitor = GuardrailMonitor()
    for _ in range(300):
        monitor.add(CANARY if rng.random() < 0.3 else BASELINE, session(rng, 0.1))
    states = [
        rollout_pb2.GuardrailState.FromString(s.SerializeToString()) for s in monitor.to_proto()
    ]
    restored = GuardrailMonitor(DEFAULT_GUARDRAILS, GuardrailConfig(), states)
    assert restored.readings() == monitor.readings()
    m = session(rng, 0.5)
    monitor.add(CANARY, m)
    restored.add(CANARY, m)
    assert restored.readings() == monitor.readings()
    # A guardrail dropped from the configuration is forgotten, not an error.
    only = GuardrailMonitor(DEFAULT_GUARDRAILS[:2], GuardrailConfig(), states)
    assert [r.name for r in only.readings()] == ["incomplete", "failed"]
