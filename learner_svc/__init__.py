"""learner_svc: consumes scored trajectories and (later) trains and publishes the policy.

Today it receives and accounts for every ScoredTrajectory (commit after processing, dedupe
by event id); PPO training, checkpoints and PolicyUpdated publishing build on this shell.
"""

from learner_svc.app import LearnerApp
from learner_svc.config import LearnerConfig

__all__ = ["LearnerApp", "LearnerConfig"]
