"""Annealing schedules: a weight as a pure function of training progress."""

from __future__ import annotations

from podium.rewards.config import Schedule
from podium.rl.schedules import cosine_schedule, linear_schedule


def anneal_fraction(progress: float, updates: int) -> float:
    """t = clip(progress / updates, 0, 1): how far along the schedule training is."""
    if updates <= 0:
        return 1.0
    return min(max(progress / updates, 0.0), 1.0)


def linear_anneal(start: float, end: float, t: float) -> float:
    """start + (end − start)·t for t in [0, 1]: :func:`podium.rl.schedules.linear_schedule`."""
    return linear_schedule(start, end, t)


def cosine_anneal(start: float, end: float, t: float) -> float:
    """end + (start − end)·(1 + cos(π t)) / 2 for t in [0, 1]:
    :func:`podium.rl.schedules.cosine_schedule`."""
    return cosine_schedule(start, end, t)


def schedule_value(schedule: Schedule, progress: float) -> float:
    """Value of ``schedule`` after ``progress`` learner updates."""
    if schedule.kind == "constant":
        return schedule.start
    t = anneal_fraction(progress, schedule.updates)
    if schedule.kind == "linear":
        return linear_anneal(schedule.start, schedule.end, t)
    return cosine_anneal(schedule.start, schedule.end, t)
