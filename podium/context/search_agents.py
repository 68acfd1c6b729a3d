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

Outputs are JSON, so a dependent (a merge step, the Context-1 agent) reads them without
guessing: a search answers ``{"retriever", "query", "hits": [{"id", "source", "start", "end",
"score", "rank", "tokens"}]}`` (no chunk text: reading is its own, budgeted step), read-chunk
``{"id", "source", "start", "end", "tokens", "text"}``. Every execution records one tool call
with its real wall-clock start and end; the work runs in a thread so concurrent executions
overlap. A query that is empty or a chunk id that does not exist is a failed execution
(``success=False`` with the reason); a dead Chroma server is too, and names its URL.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from podium.context.corpus import Chunk, count_tokens
from podium.context.index import ContextIndex, Hit
from podium.errors import CorpusError, IndexUnavailable, PluginError
from podium.subagents.plugin import ExecutionReport, ExecutionRequest, ToolCallRecord

DEFAULT_K = 10
_SEARCH_OPTIONS = frozenset({"index", "chroma_url", "k"})
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


class _IndexAgent:
    """Shared part: the index, one timed tool call per execution, failures as reports."""

    def __init__(self, index: ContextIndex) -> None:
        self._index = index

    async def _call(
        self, tool: str, arguments: dict[str, Any], work: Callable[[], dict[str, Any]]
    ) -> ExecutionReport:
        """Run ``work`` in a thread as tool call ``tool``; its JSON result is the output."""
        started = time.time()
        try:
            result = await asyncio.to_thread(work)
        except (CorpusError, IndexUnavailable, ValueError) as exc:
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

    def __init__(self, index: ContextIndex, retriever: str, k: int) -> None:
        super().__init__(index)
        self._retriever = retriever
        self._k = k

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Search for the request's description; the hits as JSON."""
        query = request.description.strip()
        arguments = {"query": query, "k": self._k}
        search = self._index.bm25 if self._retriever == "bm25" else self._index.dense

        def work() -> dict[str, Any]:
            if not query:
                raise ValueError(f"{request.subtask_id}: the description (the query) is empty")
            hits = search(query, self._k)
            return {
                "retriever": self._retriever,
                "query": query,
                "hits": [hit_json(hit) for hit in hits],
            }

        return await self._call(f"{self._retriever}.search", arguments, work)


class ReadChunkAgent(_IndexAgent):
    """``read-chunk``: the description is a chunk id."""

    async def execute(self, request: ExecutionRequest) -> ExecutionReport:
        """Read the chunk the description names; the chunk as JSON."""
        chunk_id = request.description.strip()
        return await self._call(
            "chunk.read", {"id": chunk_id}, lambda: chunk_json(self._index.chunk(chunk_id))
        )


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


def _searcher(plugin: str, retriever: str, options: Mapping[str, str]) -> SearchAgent:
    """A search agent once its options are checked (all of them before the index opens)."""
    _check_options(plugin, options, _SEARCH_OPTIONS)
    k = _k(plugin, options)
    return SearchAgent(_open(options), retriever, k)


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
