"""What has been observed of the sub-agents: the per-(agent, kind) statistics store
(:mod:`podium.observed.store`) and the follower that feeds it from the trajectory stream
(:mod:`podium.observed.follower`)."""

from podium.observed.store import FORMAT, AgentStats, Estimate, trajectory_executions

__all__ = ["FORMAT", "AgentStats", "Estimate", "trajectory_executions"]
