"""Podium's environments (Gymnasium API). ``podium.envs.swarm`` is the Agent Swarm one."""
