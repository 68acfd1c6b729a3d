"""learner_svc: the learning loop. Consumes scored trajectories, trains, checkpoints, commits
and publishes versions (:mod:`learner_svc.loop`, with an algorithm from
:mod:`learner_svc.algorithms`); ``PODIUM_LEARNER_MODE=stats`` only accounts for what it
receives (:mod:`learner_svc.app`).
"""

from learner_svc.app import LearnerApp
from learner_svc.config import LearnerConfig

__all__ = ["LearnerApp", "LearnerConfig"]
