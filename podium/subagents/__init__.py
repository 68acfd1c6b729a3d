"""Sub-agents as plug-ins: the interface real sub-agents implement and its loader
(:mod:`podium.subagents.plugin`)."""

from podium.subagents.plugin import (
    ENTRY_POINT_GROUP,
    ExecutionReport,
    ExecutionRequest,
    SubAgent,
    SubAgentFactory,
    ToolCallRecord,
    load_subagent,
    registered,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ExecutionReport",
    "ExecutionRequest",
    "SubAgent",
    "SubAgentFactory",
    "ToolCallRecord",
    "load_subagent",
    "registered",
]
