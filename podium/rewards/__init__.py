"""Reward functions: pure, deterministic scoring of trajectories.

Used by reward_svc (live scoring and re-scoring), the ``podium reward`` commands and the
embedded trainer. Nothing here does I/O except loading a config file.
"""

from podium.rewards.config import RewardConfig, default_config, load_config, reward_version
from podium.rewards.credit import Blame, CreditEntry
from podium.rewards.detectors import DETECTORS, Finding
from podium.rewards.facts import InvalidTrajectoryError
from podium.rewards.score import ScoreBreakdown, progress_from_policy_version, score

__all__ = [
    "DETECTORS",
    "Blame",
    "CreditEntry",
    "Finding",
    "InvalidTrajectoryError",
    "RewardConfig",
    "ScoreBreakdown",
    "default_config",
    "load_config",
    "progress_from_policy_version",
    "reward_version",
    "score",
]
