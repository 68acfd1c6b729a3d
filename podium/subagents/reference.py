"""The reference sub-agent plug-in, ``context-digest``: the smallest real plug-in, and the
work the Go external worker (tools/go-worker) does too.

It digests exactly the context it is given (the subtask and its dependencies' outputs) with
sha256 and answers ``<kind>:<subtask id>:<digest>``: the same output the simulated runner
gives for a success, so a pool can move an agent between ``simulated``, ``plugin`` and
``external`` and its dependents see the same outputs (the contract tests compare all three).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping

from podium.errors import PluginError
from podium.subagents.plugin import ExecutionReport, ExecutionRequest, ToolCallRecord
from podium.v1 import subtask_pb2

NAME = "context-digest"
"""Its entry-point name."""


def context_digest(context: subtask_pb2.ExecutionContext) -> str:
    """Short sha256 of exactly what an execution was given: the subtask's deterministic
    protobuf bytes, then each dependency's id and output (NUL-separated). Two executions with
    the same context agree; a dependent's digest changes when a dependency's output does."""
    h = hashlib.sha256()
    h.update(context.subtask.SerializeToString(deterministic=True))
    for dep in context.dependency_results:
        h.update(dep.subtask_id.encode())
        h.update(b"\0")
        h.update(dep.output.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


class ContextDigestAgent:
    """Answers every assignment with the digest of its context (one tool call, timed)."""

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Digest the context; never fails on a well-formed request."""
        started = time.time()
        digest = context_digest(request.context)
        ended = time.time()
        args = {"subtask": request.subtask_id, "dependencies": len(request.dependency_outputs)}
        call = ToolCallRecord(
            name="context.sha256",
            arguments_json=json.dumps(args, sort_keys=True),
            ok=True,
            result_digest=digest,
            started_at=started,
            ended_at=ended,
        )
        return ExecutionReport(
            success=True,
            output=f"{request.kind}:{request.subtask_id}:{digest}",
            tool_calls=(call,),
        )

    async def close(self) -> None:
        """Nothing to release."""


def make(options: Mapping[str, str]) -> ContextDigestAgent:
    """The factory its entry point names; it takes no options (any is refused by name)."""
    if options:
        raise PluginError(f"{NAME} takes no options, got {', '.join(sorted(options))}", plugin=NAME)
    return ContextDigestAgent()
