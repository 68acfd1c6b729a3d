"""Podium's environments (Gymnasium API). ``podium.envs.swarm`` is the Agent Swarm one.

Importing this package registers the swarm environment with Gymnasium as
``podium/Swarm-v0`` and the Context-1 one (:mod:`podium.context.env`) as ``podium/Context-v0``
(:mod:`podium.envs.registration`).
"""

from podium.envs.registration import CONTEXT_ENV_ID, SWARM_ENV_ID, make_swarm_env, register_envs

register_envs()

__all__ = ["CONTEXT_ENV_ID", "SWARM_ENV_ID", "make_swarm_env", "register_envs"]
