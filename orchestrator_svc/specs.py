"""Task specs at the service boundary: protobuf or text in, validated environment spec out.

Every task that enters a session — over gRPC as a ``TaskSpec`` message or as JSON/YAML text,
or on the tasks topic from a training driver — goes through :func:`validate_task`, which
uses the swarm environment's own parser, so a spec the service accepts is exactly a spec the
environment accepts, and every rejection is a :class:`~podium.errors.SpecError` naming the
field.
"""

from __future__ import annotations

import yaml

from podium.envs.swarm.spec import PoolSpec, TaskSpec, check_task_against_pool, parse_task
from podium.envs.swarm.trajectory import task_from_proto
from podium.errors import SpecError
from podium.v1 import task_pb2

TEXT_FIELD = "task_spec_text"
"""Request field holding a task as JSON/YAML text."""


def parse_task_text(text: str) -> TaskSpec:
    """Parse a JSON or YAML task spec (YAML is a superset of JSON, so one parser does both)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (
            f"{TEXT_FIELD}:{mark.line + 1}:{mark.column + 1}" if mark is not None else TEXT_FIELD
        )
        raise SpecError(
            f"{where}: invalid JSON/YAML: {getattr(exc, 'problem', exc)}", field=TEXT_FIELD
        ) from exc
    return parse_task(doc, source=TEXT_FIELD)


def validate_task(
    pool: PoolSpec,
    *,
    message: task_pb2.TaskSpec | None = None,
    text: str = "",
) -> TaskSpec:
    """The validated task from exactly one of ``message`` or ``text``; checked against ``pool``.

    Raises :class:`SpecError` whose ``field`` names the offending field or subtask id.
    """
    has_message = message is not None and (bool(message.name) or len(message.subtasks) > 0)
    if has_message and text:
        raise SpecError("give either task or task_spec_text, not both", field="task")
    if not has_message and not text:
        raise SpecError("no task: set task or task_spec_text", field="task")
    if text:
        task = parse_task_text(text)
    else:
        assert message is not None
        task = task_from_proto(message)
    check_task_against_pool(task, pool)
    return task
