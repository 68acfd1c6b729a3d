"""Learning algorithms the loop (:mod:`learner_svc.loop`) can drive.

* :mod:`learner_svc.algorithms.ppo`: generic PPO on flat observations;
* :mod:`learner_svc.algorithms.swarm`: the orchestrator's swarm policy (behaviour cloning for
  the cold start, PPO with the rollout baseline, critic warm-up and size-bucketed minibatches).
"""
