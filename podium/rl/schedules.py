"""Schedules: a hyperparameter as a pure function of training progress in [0, 1].

The one implementation of each decay shape: the learners' learning rates and entropy
coefficients (:mod:`podium.rl.ppo` re-exports them) and the reward's annealed weights
(:mod:`podium.rewards.schedules`) all call these. Kept free of torch so the reward service,
which anneals weights but trains nothing, does not import it.
"""

from __future__ import annotations

import math


def cosine_schedule(start: float, end: float, progress: float) -> float:
    """Cosine decay from ``start`` (progress 0) to ``end`` (progress 1); progress is clamped.

    ``end + (start − end)·(1 + cos(π·progress)) / 2``: SGDR-style (Loshchilov & Hutter, 2017),
    without restarts.
    """
    p = min(max(progress, 0.0), 1.0)
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * p))


def linear_schedule(start: float, end: float, progress: float) -> float:
    """Linear interpolation from ``start`` (progress 0) to ``end`` (progress 1), clamped."""
    p = min(max(progress, 0.0), 1.0)
    return start + (end - start) * p
