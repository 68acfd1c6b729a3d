"""The three search sub-agents, as plug-ins (:mod:`podium.subagents.plugin`).

``bm25-search``
    The subtask's description is a query; the output is the top ``k`` BM25 hits.
``dense-search``
    The same with all-MiniLM-L6-v2 embeddings in Chroma.
``read-chunk``
    The description is a chunk id (as a search returned it); the output is that chunk.

Their options (the agent's ``options:`` in the pool spec):

``index``
    The index directory ``podium context index`` wrote (required).
``chroma_url``
    A Chroma server holding the index's vectors (default: where the index was built).
``k``
    Hits per search (default 10; search agents only).
``processes``
    Search agents only: worker processes that run the searches (default 0: in this process,
    in threads). ``N`` keeps a pool of N worker processes (:mod:`podium.procpool`),
    each with the index open once and torch on one thread, so searches run on N cores
    instead of taking turns under the GIL; ``auto``: one per CPU this process may use, at
    most 8. Searches that arrive while every worker is busy go to the next free one
    together (:class:`~podium.procpool.Batcher`): a dense worker embeds them in one
    call, about half the CPU a query of embedding them one by one.

Outputs are JSON, so a dependent (a merge step, the Context-1 agent) reads them without
guessing: a search answers ``{"retriever", "query", "hits": [{"id", "source", "start", "end",
"score", "rank", "tokens"}]}`` (no chunk text: reading is its own, budgeted step), read-chunk
``{"id", "source", "start", "end", "tokens", "text"}``. Every execution records one tool call
with its real wall-clock start and end (waiting for a free worker included); the work runs in
a thread, or a worker process, so concurrent executions overlap. A query that is empty or a
chunk id that does not exist is a failed execution (``success=False`` with the reason); a dead
Chroma server is too, and names its URL. A worker process that dies mid-search raises a
retriable :class:`~podium.errors.WorkerError` naming it (subagent_svc redelivers the
assignment) and is replaced on the next search.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from podium.context.corpus import Chunk
from podium.context.index import ContextIndex, Hit
from podium.errors import CorpusError, IndexUnavailable, PluginError
from podium.procpool import Batcher, WorkerPool, resolve_processes
from podium.subagents.plugin import ExecutionReport, ExecutionRequest, ToolCallRecord
from podium.tokens import count_tokens

DEFAULT_K = 10
_SEARCH_OPTIONS = frozenset({"index", "chroma_url", "k", "processes"})
_FAILURES = (CorpusError, IndexUnavailable, ValueError)
"""What a search or a read may raise that is a failed execution, not a broken agent."""
_READ_OPTIONS = frozenset({"index", "chroma_url"})


def hit_json(hit: Hit) -> dict[str, Any]:
    """One hit as the search agents report it (no text)."""
    chunk = hit.chunk
    return {
        "id": chunk.id,
        "source": chunk.source,
        "start": chunk.start,
        "end": chunk.end,
        "score": round(hit.score, 6),
        "rank": hit.rank,
        "tokens": count_tokens(chunk.text),
    }


def chunk_json(chunk: Chunk) -> dict[str, Any]:
    """One chunk as read-chunk reports it (with its text and token count)."""
    return {**asdict(chunk), "tokens": count_tokens(chunk.text)}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def search_result(index: ContextIndex, retriever: str, query: str, k: int) -> dict[str, Any]:
    """A search agent's output: ``retriever``'s top ``k`` hits for ``query`` (the same in
    this process and in a worker process)."""
    search = index.bm25 if retriever == "bm25" else index.dense
    return {
        "retriever": retriever,
        "query": query,
        "hits": [hit_json(hit) for hit in search(query, k)],
    }


def worker_setup(path: str, chroma_url: str | None, retriever: str) -> tuple[ContextIndex, str]:
    """A search worker's state, built once in the worker process: the index opened and
    warmed up (BM25 loaded, or the embedding model and Chroma), torch on one thread so
    workers side by side do not oversubscribe the cores."""
    if retriever == "dense":
        import torch

        torch.set_num_threads(1)
    index = ContextIndex.open(Path(path), chroma_url=chroma_url)
    # A failure now (e.g. a Chroma server down) is reported by the first real search.
    with suppress(*_FAILURES):
        search_result(index, retriever, "warm up", 1)
    return index, retriever


def worker_search(
    state: tuple[ContextIndex, str], requests: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """Searches in a worker process, each request ``(query, k)``; dense queries of the same
    ``k`` are embedded together (:meth:`ContextIndex.dense_many`)."""
    index, retriever = state
    if retriever != "dense" or len({k for _, k in requests}) != 1:
        return [search_result(index, retriever, query, k) for query, k in requests]
    k = requests[0][1]
    queries = [query for query, _ in requests]
    return [
        {"retriever": retriever, "query": query, "hits": [hit_json(hit) for hit in hits]}
        for query, hits in zip(queries, index.dense_many(queries, k), strict=True)
    ]


class _IndexAgent:
    """Shared part: the index, one timed tool call per execution, failures as reports."""

    def __init__(self, index: ContextIndex) -> None:
        self._index = index

    async def _call(
        self, tool: str, arguments: dict[str, Any], work: Callable[[], Awaitable[dict[str, Any]]]
    ) -> ExecutionReport:
        """Await ``work()`` as tool call ``tool``; its JSON result is the output."""
        started = time.time()
        try:
            result = await work()
        except _FAILURES as exc:
            ended = time.time()
            call = ToolCallRecord(tool, _json(arguments), False, "", started, max(ended, started))
            return ExecutionReport(success=False, output="", tool_calls=(call,), error=str(exc))
        ended = time.time()
        output = _json(result)
        call = ToolCallRecord(
            tool, _json(arguments), True, _digest(output), started, max(ended, started)
        )
        return ExecutionReport(success=True, output=output, tool_calls=(call,))

    async def close(self) -> None:
        """Release the index's Chroma client."""
        self._index.close()


class SearchAgent(_IndexAgent):
    """``bm25-search`` / ``dense-search``: the description is the query."""

    def __init__(self, index: ContextIndex, retriever: str, k: int, processes: int = 0) -> None:
        """``processes`` > 0: searches run in a pool of that many worker processes."""
        super().__init__(index)
        self._retriever = retriever
        self._k = k
        self._workers: WorkerPool | None = None
        self._batcher: Batcher | None = None
        if processes > 0:
            setup = partial(worker_setup, str(index.path), index.chroma_url, retriever)
            self._workers = WorkerPool(
                f"{retriever}-search", processes, setup, worker_search, _FAILURES
            )
            self._batcher = Batcher(self._workers)

    @property
    def largest_batch(self) -> int:
        """The most searches sent to a worker together so far (0 in-process)."""
        return 0 if self._batcher is None else self._batcher.largest

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the live worker processes (none in-process or before a search)."""
        return () if self._workers is None else self._workers.pids()

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Search for the request's description; the hits as JSON."""
        query = request.description.strip()
        arguments = {"query": query, "k": self._k}

        async def work() -> dict[str, Any]:
            if not query:
                raise ValueError(f"{request.subtask_id}: the description (the query) is empty")
            if self._batcher is not None:
                reply: dict[str, Any] = await self._batcher.call((query, self._k))
                return reply
            return await asyncio.to_thread(
                search_result, self._index, self._retriever, query, self._k
            )

        return await self._call(f"{self._retriever}.search", arguments, work)

    async def close(self) -> None:
        """End the worker processes (if any), then release the index."""
        if self._workers is not None:
            await self._workers.close()
        await super().close()


class ReadChunkAgent(_IndexAgent):
    """``read-chunk``: the description is a chunk id."""

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Read the chunk the description names; the chunk as JSON."""
        chunk_id = request.description.strip()

        async def work() -> dict[str, Any]:
            return await asyncio.to_thread(lambda: chunk_json(self._index.chunk(chunk_id)))

        return await self._call("chunk.read", {"id": chunk_id}, work)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _check_options(plugin: str, options: Mapping[str, str], allowed: frozenset[str]) -> None:
    """Unknown options, or no ``index``, raise :class:`PluginError` naming them."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise PluginError(
            f"{plugin}: unknown option(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(allowed))})",
            plugin=plugin,
        )
    if not options.get("index"):
        raise PluginError(
            f"{plugin}: option 'index' (the index directory) is required", plugin=plugin
        )


def _open(options: Mapping[str, str]) -> ContextIndex:
    """The index the (checked) options name."""
    return ContextIndex.open(Path(options["index"]), chroma_url=options.get("chroma_url") or None)


def _k(plugin: str, options: Mapping[str, str]) -> int:
    raw = options.get("k", str(DEFAULT_K))
    try:
        k = int(raw)
    except ValueError:
        k = 0
    if k < 1:
        raise PluginError(
            f"{plugin}: option k must be a positive integer, got {raw!r}", plugin=plugin
        )
    return k


def _processes(plugin: str, options: Mapping[str, str]) -> int:
    """The ``processes`` option as a count (0 when absent), or a :class:`PluginError`."""
    try:
        return resolve_processes(options.get("processes", "0"))
    except ValueError as exc:
        raise PluginError(f"{plugin}: option processes {exc}", plugin=plugin) from exc


def _searcher(plugin: str, retriever: str, options: Mapping[str, str]) -> SearchAgent:
    """A search agent once its options are checked (all of them before the index opens;
    worker processes start on the first search)."""
    _check_options(plugin, options, _SEARCH_OPTIONS)
    k = _k(plugin, options)
    processes = _processes(plugin, options)
    return SearchAgent(_open(options), retriever, k, processes)


def make_bm25(options: Mapping[str, str]) -> SearchAgent:
    """Factory of ``bm25-search`` (its entry point)."""
    return _searcher("bm25-search", "bm25", options)


def make_dense(options: Mapping[str, str]) -> SearchAgent:
    """Factory of ``dense-search`` (its entry point)."""
    return _searcher("dense-search", "dense", options)


def make_read_chunk(options: Mapping[str, str]) -> ReadChunkAgent:
    """Factory of ``read-chunk`` (its entry point)."""
    _check_options("read-chunk", options, _READ_OPTIONS)
    return ReadChunkAgent(_open(options))
