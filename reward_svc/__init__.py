"""reward_svc: turns trajectories into scored trajectories.

Consumes :data:`podium.topics.TRAJECTORIES`, scores each trajectory with
:func:`podium.rewards.score` and produces :data:`podium.topics.SCORED_TRAJECTORIES`, exactly
once on every bus (:class:`reward_svc.app.RewardApp` on :class:`podium.bus.Transformer`).
Run it with ``python -m reward_svc``; settings come from the environment
(:class:`reward_svc.config.RewardServiceConfig`).
"""
