"""The event-driven simulator of the swarm: sampled durations and completions on a clock."""

from podium.envs.swarm.simulator.executor import SwarmSimulator

__all__ = ["SwarmSimulator"]
