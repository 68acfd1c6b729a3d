"""Reinforcement learning: PPO as pure functions (:mod:`podium.rl.ppo`), an actor-critic MLP
(:mod:`podium.rl.networks`), one PPO update shared by every trainer (:mod:`podium.rl.update`)
and a Gymnasium trainer with an evaluator (:mod:`podium.rl.trainer`). See docs/learner.md."""
