"""CartPole-v1 solved within 150,000 env steps on each of 3 seeds.

Solved = mean return >= 475 over 20 evaluation episodes, greedy (deterministic) actions, on
evaluation environments separate from the training ones, checked every 5,120 env steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podium.rl.ppo import PPOConfig
from podium.rl.trainer import Evaluator, IterationStats, PPOTrainer

BUDGET = 150_000
EVAL_EVERY = 5_120


def steps_to_solve(seed: int) -> tuple[int | None, list[tuple[int, float]]]:
    trainer = PPOTrainer("CartPole-v1", PPOConfig(total_env_steps=BUDGET, seed=seed))
    evaluator = Evaluator("CartPole-v1", 20, seed=50_000 + seed)
    curve: list[tuple[int, float]] = []
    next_eval = EVAL_EVERY

    def on_iteration(it: IterationStats) -> bool:
        nonlocal next_eval
        if it.global_step < next_eval:
            return False
        next_eval += EVAL_EVERY
        curve.append((it.global_step, float(np.mean(evaluator.evaluate(trainer.model)))))
        return curve[-1][1] >= 475.0

    try:
        trainer.train(on_iteration)
    finally:
        trainer.close()
        evaluator.close()
    solved = next((s for s, r in curve if r >= 475.0), None)
    return solved, curve


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cartpole_solved_within_budget(seed: int) -> None:
    torch.set_num_threads(1)
    solved, curve = steps_to_solve(seed)
    assert solved is not None and solved <= BUDGET, f"seed {seed} not solved: {curve}"
