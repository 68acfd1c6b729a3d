"""Event-driven simulator and Gymnasium environment of the swarm."""

from podium.envs.swarm.simulator.env import ActionCodec, EnvConfig, SwarmEnv
from podium.envs.swarm.simulator.executor import SwarmSimulator

__all__ = ["ActionCodec", "EnvConfig", "SwarmEnv", "SwarmSimulator"]
