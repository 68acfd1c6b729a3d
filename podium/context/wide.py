"""Wide-search tasks: a composite question for the swarm, its sub-questions searched in parallel.

A wide-search task (:func:`wide_task`) holds, for each of its N sub-questions, a BM25 search
(kind :data:`LEXICAL`) and a dense search (kind :data:`SEMANTIC`) whose description is the
sub-question, and one merge subtask (kind :data:`MERGE`) depending on all of them that fuses
each sub-question's two result lists by reciprocal rank fusion: a hybrid search per
sub-question, 2N independent searches wide. The swarm orchestrator schedules it like any
task; the pool (:func:`wide_pool`, from the shipped ``podium/data/pools/wide-search.yaml``)
runs the searches on the real search sub-agents (``bm25-search``, ``dense-search``,
:mod:`podium.context.search_agents`; ``processes: auto``: in worker processes, one per CPU, so
searches side by side do not take turns under the GIL) and the merge on ``wide-merge``
(:class:`MergeAgent`), all ``runner: plugin``, so every latency is real and the task's latency
is its real critical path.

:func:`run_direct` runs the same subtasks one after another on the same plug-ins without any
bus or orchestrator: the floor a one-by-one run cannot beat, beside the swarm's sequential
schedule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from podium.context.env import RRF_K
from podium.context.questions import Question
from podium.envs.swarm.spec import (
    RUNNER_PLUGIN,
    PoolSpec,
    Subtask,
    TaskSpec,
    load_pool,
    task_to_dict,
)
from podium.errors import ConfigError, PluginError
from podium.subagents.plugin import ExecutionReport, ExecutionRequest, SubAgent, ToolCallRecord
from podium.v1 import subtask_pb2, task_pb2

LEXICAL = "lexical"
"""Kind of a sub-question's BM25 search."""
SEMANTIC = "semantic"
"""Kind of a sub-question's dense search."""
MERGE = "merge"
"""Kind of the merge subtask."""
MERGE_ID = "merge"
"""Id of the merge subtask."""
DEFAULT_MERGE_K = 5
"""Fused hits the merge keeps per sub-question."""
_SEARCH_WORK = 1.0
_MERGE_WORK = 0.2


def wide_pool_path() -> Path:
    """The shipped wide-search pool (``podium/data/pools/wide-search.yaml``)."""
    return Path(str(resources.files("podium") / "data" / "pools" / "wide-search.yaml"))


def wide_task(questions: Sequence[Question], name: str) -> TaskSpec:
    """The wide-search task of ``questions``: a BM25 and a dense search of each, then a
    merge of all (``max_parallel`` = every search at once)."""
    if not questions:
        raise ConfigError(f"wide-search task {name!r} needs at least one sub-question")
    searches: list[Subtask] = []
    for i, q in enumerate(questions):
        text = " ".join(q.question.split())
        searches.append(Subtask(f"q{i:02d}.bm25", LEXICAL, _SEARCH_WORK, description=text))
        searches.append(Subtask(f"q{i:02d}.dense", SEMANTIC, _SEARCH_WORK, description=text))
    merge = Subtask(
        MERGE_ID,
        MERGE,
        _MERGE_WORK,
        deps=tuple(s.id for s in searches),
        description=f"fuse the hits of {len(questions)} sub-questions",
    )
    return TaskSpec(
        name, (*searches, merge), max_parallel=len(searches), description=f"wide search {name}"
    )


def wide_tasks(questions: Sequence[Question], width: int, count: int) -> list[TaskSpec]:
    """``count`` wide-search tasks of ``width`` sub-questions each, the questions taken in
    file order (a :class:`ConfigError` when there are fewer than ``width * count``)."""
    if width < 1 or count < 1:
        raise ConfigError(f"wide-search tasks need width >= 1 and count >= 1, got {width}, {count}")
    if len(questions) < width * count:
        raise ConfigError(
            f"{count} wide-search tasks of {width} sub-questions need {width * count} "
            f"questions, the file has {len(questions)}"
        )
    return [
        wide_task(questions[t * width : (t + 1) * width], f"wide-{t:03d}") for t in range(count)
    ]


def task_text(task: TaskSpec) -> str:
    """The task as the JSON a ``SubmitTask`` request carries."""
    return json.dumps(task_to_dict(task))


def wide_pool(
    index: Path | str,
    *,
    chroma_url: str | None = None,
    k: int = 10,
    width: int = 8,
    processes: str | None = None,
) -> PoolSpec:
    """The shipped wide-search pool pointed at ``index``: every plug-in agent but the merge
    gets ``index`` (and ``chroma_url``), the searches ``k`` hits and, when given,
    ``processes`` (their worker processes: ``"0"``, ``"N"`` or ``"auto"``; None keeps the
    shipped file's), and the pool runs up to ``2 * width`` executions at once."""
    pool = load_pool(wide_pool_path())
    agents = []
    for agent in pool.agents:
        options = dict(agent.runner.options)
        if agent.runner.kind == RUNNER_PLUGIN and agent.runner.plugin != "wide-merge":
            options["index"] = str(index)
            if chroma_url:
                options["chroma_url"] = chroma_url
            if agent.runner.plugin != "read-chunk":
                options["k"] = str(k)
                if processes is not None:
                    options["processes"] = processes
        agents.append(replace(agent, runner=replace(agent.runner, options=options)))
    return replace(pool, agents=tuple(agents), max_parallel=max(2 * width, 1))


# ---------------------------------------------------------------- the merge plug-in


def fuse(outputs: Mapping[str, str], k: int) -> list[dict[str, Any]]:
    """Each query's hits over every search output in ``outputs`` (search agents' JSON, by
    subtask id), fused by reciprocal rank fusion, best ``k`` ids per query, queries in order
    of first appearance. A malformed output raises ``ValueError`` naming its subtask."""
    scores: dict[str, dict[str, float]] = {}
    for subtask, text in sorted(outputs.items()):
        try:
            result = json.loads(text)
            query, hits = str(result["query"]), list(result["hits"])
            ranked = [(str(h["id"]), int(h["rank"])) for h in hits]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{subtask}: not a search agent's output ({exc})") from exc
        fused = scores.setdefault(query, {})
        for chunk_id, rank in ranked:
            fused[chunk_id] = fused.get(chunk_id, 0.0) + 1.0 / (RRF_K + rank + 1)
    return [
        {"query": query, "hits": sorted(fused, key=lambda c: (-fused[c], c))[:k]}
        for query, fused in scores.items()
    ]


@dataclass(frozen=True, slots=True)
class MergeAgent:
    """``wide-merge``: fuses the dependency outputs (search results) per sub-question."""

    k: int = DEFAULT_MERGE_K
    """Fused hits kept per sub-question."""

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """The fused hits as JSON ``{"answers": [{"query", "hits": [ids]}]}``; one tool call."""
        started = time.time()
        arguments = json.dumps({"inputs": sorted(request.dependency_outputs), "k": self.k})
        try:
            answers = fuse(request.dependency_outputs, self.k)
        except ValueError as exc:
            call = ToolCallRecord("rrf.merge", arguments, False, "", started, time.time())
            return ExecutionReport(False, "", (call,), str(exc))
        output = json.dumps({"answers": answers}, sort_keys=True)
        call = ToolCallRecord("rrf.merge", arguments, True, "", started, time.time())
        return ExecutionReport(True, output, (call,))

    async def close(self) -> None:
        """Nothing to release."""


def make_merge(options: Mapping[str, str]) -> MergeAgent:
    """Factory of ``wide-merge`` (its entry point); option ``k`` (default 5)."""
    unknown = sorted(set(options) - {"k"})
    if unknown:
        raise PluginError(
            f"wide-merge: unknown option(s) {', '.join(unknown)} (allowed: k)", plugin="wide-merge"
        )
    raw = options.get("k", str(DEFAULT_MERGE_K))
    if not raw.isdigit() or int(raw) < 1:
        raise PluginError(
            f"wide-merge: option k must be a positive integer, got {raw!r}", plugin="wide-merge"
        )
    return MergeAgent(int(raw))


# ---------------------------------------------------------------- one after another, directly


def request_of(
    task: TaskSpec, subtask: Subtask, agent: str, outputs: Mapping[str, str]
) -> ExecutionRequest:
    """The request subagent_svc would give ``agent`` for ``subtask`` (its dependencies'
    ``outputs``), without a bus."""
    deps = {d: outputs[d] for d in subtask.deps}
    context = subtask_pb2.ExecutionContext(
        subtask=task_pb2.SubtaskSpec(
            id=subtask.id, kind=subtask.kind, work=subtask.work, description=subtask.description
        ),
        dependency_results=[
            subtask_pb2.DependencyResult(subtask_id=k, output=v) for k, v in deps.items()
        ],
    )
    return ExecutionRequest(
        session_id=task.name,
        execution_id=f"{task.name}.{subtask.id}",
        subtask_id=subtask.id,
        kind=subtask.kind,
        agent=agent,
        attempt=1,
        description=subtask.description,
        dependency_outputs=deps,
        context=context,
    )


async def run_direct(
    task: TaskSpec, agents: Mapping[str, SubAgent], by_kind: Mapping[str, str]
) -> dict[str, str]:
    """Run ``task``'s subtasks one after another in file order (dependencies first) on
    ``agents`` (by name; ``by_kind`` names the agent of each kind); the outputs by subtask
    id. A failed execution raises :class:`PluginError` naming the subtask and its error."""
    outputs: dict[str, str] = {}
    for subtask in task.subtasks:
        agent = by_kind[subtask.kind]
        report = await agents[agent].execute(request_of(task, subtask, agent, outputs))
        if not report.success:
            raise PluginError(
                f"{task.name}: {subtask.id} on {agent} failed: {report.error}", plugin=agent
            )
        outputs[subtask.id] = report.output
    return outputs
