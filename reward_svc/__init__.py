"""reward_svc: turns trajectories into scored trajectories.

Consumes :data:`podium.topics.TRAJECTORIES`, scores each trajectory with
:func:`podium.rewards.score` and produces :data:`podium.topics.SCORED_TRAJECTORIES`;
exactly-once on Kafka (:mod:`reward_svc.kafka_loop`), effectively-once on the generic bus
(:mod:`reward_svc.bus_loop`). Run it with ``python -m reward_svc``; settings come from the
environment (:mod:`reward_svc.config`).
"""
