"""subagent_svc: the frozen sub-agents.

Consumes ``SubtaskAssigned`` as a consumer group (scale by starting more processes), runs each
execution in a fresh context that holds only its subtask and its dependencies' outputs, and
publishes a ``SubtaskResult`` with the task-relevant output only ("context sharding").
"""

from subagent_svc.app import SubagentApp
from subagent_svc.config import SubagentConfig

__all__ = ["SubagentApp", "SubagentConfig"]
