"""The Context-1 environment (Gymnasium API): search, read, keep or prune under a token budget.

An episode is one question. The agent sees the question only through features (never the
gold) and acts on a *candidate queue*: every chunk a search returned and the agent has not
yet kept or pruned, ordered by reciprocal rank fusion (RRF) over all searches made so far.
The head of the queue is the chunk the agent decides on. Actions (``Discrete``):

* ``search(retriever, form)`` for each retriever (:data:`RETRIEVERS`: ``bm25``, ``dense``) and
  query form (:data:`QUERY_FORMS`: the question as is, its key terms, the identifiers it
  names): a real query to the :class:`~podium.context.index.ContextIndex`, its latency
  measured; new hits join the queue, known ones gain a rank;
* ``read``: look at the head's text — its body term overlap with the question and whether it
  holds the question's identifiers join the observation (a turn spent, like opening a page);
* ``keep``: the head joins the kept context (only if it fits the remaining budget);
* ``prune``: the head is discarded;
* ``finish``: the kept context is scored.

The observation (:data:`OBSERVATION_FEATURES` names each column, all in [0, 1]) holds the
budget used, searches and steps made, which searches were done, the question's own features
(length, whether it names identifiers, quotes a phrase or names a constant, its key terms
hashed into buckets: what a policy conditions its query forms on), the head's retriever
scores and ranks, RRF score, title term overlap, length, position in its document, — once
read — body overlap, and its *match* with what the question names (:func:`match_features`,
from the hit's text on arrival: the document's file name, its heading line's document and
section titles, the question's names, constant, quoted phrase and version in its text, the
section title's words hashed), the next :attr:`ContextEnvConfig.lookahead` candidates'
scores, overlaps and positions, and a summary of the kept context. Scores are normalised per search (BM25 by
the search's best score; dense cosine as is, clipped), so the features mean the same on any
corpus.

Reward: 0 per step and, at the end (finish, or truncation after ``max_steps``), the whole
:func:`~podium.rewards.context.context_reward` of the episode, so the return equals the
Context-1 reward with its detectors. An action the state does not allow (``keep`` with
nothing queued or over the budget, a search past ``max_searches``) is recorded as ``invalid``
and charged by that reward; :meth:`ContextEnv.action_masks` gives the valid set. Repeating a
search is allowed — it is the loop the ``search_loop`` detector charges.

``info`` at the end holds ``answer_found``, ``precision``, ``gold_recall``, ``tokens_kept``,
``searches``, ``wall_s`` (the episode's wall time), ``search_s`` (time inside the index),
``kept`` (chunk ids), ``reward`` (the breakdown) and ``episode`` (the
:class:`~podium.rewards.context.ContextEpisode`, the reward's input).
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from podium.context.corpus import Chunk
from podium.context.index import ContextIndex, Hit
from podium.context.questions import Question, load_questions
from podium.errors import ConfigError
from podium.rewards.config import ContextRewardConfig
from podium.rewards.context import (
    ContextEpisode,
    ContextStep,
    StepKind,
    context_reward,
)
from podium.tokens import count_tokens

RETRIEVERS: tuple[str, ...] = ("bm25", "dense")
"""The retrievers a search can use (methods of the index)."""

QUERY_FORMS: tuple[str, ...] = ("question", "keywords", "identifier")
"""How a search phrases the question (:func:`make_query`)."""

RRF_K = 60
"""Reciprocal rank fusion constant (Cormack et al.): score = Σ 1 / (RRF_K + rank + 1)."""

_STOPWORD_TEXT = """a an and are as at be by can could did do does for from has have how i if in into is it
    its of on or page pages python should that the their there these this to under used was
    were what when where which who why will with would you your about after all also any
    because been before being between both but each few more most other same so some such
    than then they those through too very via while listed"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""Words a key-term query drops (question words and function words)."""

_WORD = re.compile(r"[A-Za-z_][\w.]*\w|\w")
_IDENTIFIER = re.compile(
    r"[A-Za-z_]\w*(?:\.\w+)+|\w+\(\)|[A-Za-z]*_\w+|\b[A-Z][A-Z0-9_]{2,}\b|\b[a-z]+[A-Z]\w*|"
    r"\b[A-Z][a-z]+[A-Z]\w*|<[\w./]+>|\b\w+\(\d\w*\)"
)
_SECTION_WORDS = frozenset(
    [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "ERRORS",
        "SEE",
        "ALSO",
        "RETURN",
        "VALUE",
        "NOTES",
        "BUGS",
        "EXAMPLES",
        "FAQ",
    ]
)
"""Capitalised words a question uses to name a part of a page, not an identifier."""
_QUOTED = re.compile(r"'([^']{3,})'|\"([^\"]{3,})\"")


# ---------------------------------------------------------------- queries and overlap


def key_terms(text: str) -> list[str]:
    """Lower-cased content words of ``text`` in order, stop words and repeats dropped."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        word = word.strip(".")
        if word and word not in _STOPWORDS and word not in out:
            out.append(word)
    return out


def identifiers(text: str) -> list[str]:
    """What ``text`` names: dotted names, calls, ``snake_case``, ``ERRNO`` constants,
    ``camelCase``, ``<header.h>``, ``page(2)`` references and quoted phrases, in order."""
    found: list[str] = []
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        word = re.sub(r"\(\d\w*\)$|\(\)$", "", word).strip("<>")
        if word and word not in found and word not in _SECTION_WORDS:
            found.append(word)
    for a, b in _QUOTED.findall(text):
        if (a or b) not in found:
            found.append(a or b)
    return found


def make_query(question: str, form: str) -> str:
    """The query a search of ``form`` sends: the question as is, its key terms, or the
    identifiers it names (key terms when it names none)."""
    if form == "question":
        return question
    if form == "keywords":
        return " ".join(key_terms(question)) or question
    if form == "identifier":
        return " ".join(identifiers(question)) or make_query(question, "keywords")
    raise ConfigError(f"query form {form!r} unknown (known: {', '.join(QUERY_FORMS)})")


def overlap(terms: Sequence[str], text: str) -> float:
    """Fraction of ``terms`` (lower-case) present among ``text``'s key terms."""
    if not terms:
        return 0.0
    present = set(key_terms(text))
    return sum(1 for t in terms if t in present) / len(terms)


def title_of(chunk: Chunk) -> str:
    """The chunk's heading line (document and section titles): what a result list shows."""
    return chunk.text.split("\n", 1)[0]


# ---------------------------------------------------------------- configuration


class SearchIndex(Protocol):
    """What the environment needs of an index (:class:`~podium.context.index.ContextIndex`)."""

    def bm25(self, query: str, k: int) -> list[Hit]: ...

    def dense(self, query: str, k: int) -> list[Hit]: ...


class CachedIndex:
    """An index whose search results are remembered per (retriever, query, k).

    Training replays the same questions for many epochs, and a dense query costs an
    embedding each time; the results of a deterministic index do not change, so they are
    kept (up to ``max_entries``, oldest dropped first). The latency a cached search reports
    is the cache's, not the index's: use it for training, not for a benchmark.
    """

    def __init__(self, index: SearchIndex, max_entries: int = 100_000) -> None:
        self.index = index
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._results: dict[tuple[str, str, int], list[Hit]] = {}

    def _cached(self, retriever: str, query: str, k: int) -> list[Hit]:
        key = (retriever, query, k)
        found = self._results.get(key)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        found = self.index.bm25(query, k) if retriever == "bm25" else self.index.dense(query, k)
        if len(self._results) >= self.max_entries:
            del self._results[next(iter(self._results))]
        self._results[key] = found
        return found

    def bm25(self, query: str, k: int) -> list[Hit]:
        """BM25 hits, from the cache when this query was asked before."""
        return self._cached("bm25", query, k)

    def dense(self, query: str, k: int) -> list[Hit]:
        """Dense hits, from the cache when this query was asked before."""
        return self._cached("dense", query, k)


@dataclass(frozen=True, slots=True)
class ContextEnvConfig:
    """Settings of :class:`ContextEnv`."""

    budget_tokens: int = 1000
    """Most tokens (:func:`~podium.tokens.count_tokens`) the kept context may hold."""
    top_k: int = 20
    """Hits each search returns."""
    max_searches: int = 6
    """Searches an episode may make (more are invalid)."""
    max_steps: int = 64
    """Actions before the episode is truncated (and scored as it stands)."""
    lookahead: int = 3
    """Queued candidates after the head described in the observation."""
    reward: ContextRewardConfig = field(default_factory=ContextRewardConfig)
    """The reward's weights and detectors."""

    def __post_init__(self) -> None:
        for name in ("budget_tokens", "top_k", "max_searches", "max_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"ContextEnvConfig.{name} must be >= 1, got {getattr(self, name)}"
                )
        if self.lookahead < 0:
            raise ConfigError(f"ContextEnvConfig.lookahead must be >= 0, got {self.lookahead}")


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class ActionSpace:
    """Action index ↔ meaning: the searches first (retriever-major), then read, keep, prune,
    finish."""

    searches: tuple[tuple[str, str], ...] = tuple((r, f) for r in RETRIEVERS for f in QUERY_FORMS)

    @property
    def read(self) -> int:
        """Index of ``read``."""
        return len(self.searches)

    @property
    def keep(self) -> int:
        """Index of ``keep``."""
        return len(self.searches) + 1

    @property
    def prune(self) -> int:
        """Index of ``prune``."""
        return len(self.searches) + 2

    @property
    def finish(self) -> int:
        """Index of ``finish``."""
        return len(self.searches) + 3

    @property
    def size(self) -> int:
        """Number of actions."""
        return len(self.searches) + 4

    def search(self, retriever: str, form: str) -> int:
        """Index of the search ``(retriever, form)``."""
        return self.searches.index((retriever, form))

    def name(self, action: int) -> str:
        """``search:bm25:question``, ``read``, ``keep``, ``prune`` or ``finish``."""
        if 0 <= action < len(self.searches):
            return "search:" + ":".join(self.searches[action])
        names = {self.read: "read", self.keep: "keep", self.prune: "prune", self.finish: "finish"}
        if action not in names:
            raise ConfigError(f"action {action} outside 0..{self.size - 1}")
        return names[action]


ACTIONS = ActionSpace()
"""The environment's action layout."""


# ---------------------------------------------------------------- state


@dataclass(slots=True)
class Candidate:
    """A chunk some search returned, with what the searches said about it."""

    chunk: Chunk
    tokens: int
    first_seen: int
    """Order of first appearance (breaks RRF ties deterministically)."""
    score: dict[str, float] = field(default_factory=dict)
    """Retriever → best normalised score."""
    rank: dict[str, int] = field(default_factory=dict)
    """Retriever → best 0-based rank."""
    rrf: float = 0.0
    """Σ over searches that returned it of 1 / (RRF_K + rank + 1)."""
    returned: int = 0
    """Searches that returned it."""
    read: bool = False
    title_overlap: float = 0.0
    body_overlap: float = 0.0
    """Known once read."""
    names_identifier: bool = False
    """Holds an identifier of the question (known once read)."""
    match: list[float] = field(default_factory=list)
    """:func:`match_features` of its text against the question (computed on arrival)."""


@dataclass(slots=True)
class ContextState:
    """The episode in flight (read it; the environment changes it)."""

    question: Question
    terms: list[str]
    idents: list[str]
    question_features: list[float]
    """:func:`question_features` of the question (computed once per episode)."""
    cues: QuestionCues
    """What a chunk is matched against (:func:`question_cues`, once per episode)."""
    queue: dict[str, Candidate] = field(default_factory=dict)
    """Undecided candidates by chunk id."""
    kept: list[Candidate] = field(default_factory=list)
    decided: set[str] = field(default_factory=set)
    """Chunk ids kept or pruned (a later search does not bring them back)."""
    searched: list[tuple[str, str]] = field(default_factory=list)
    steps: list[ContextStep] = field(default_factory=list)
    tokens_kept: int = 0
    seen: int = 0
    """Candidates ever queued (the next one's ``first_seen``)."""
    search_s: float = 0.0
    started: float = 0.0

    def ordered(self) -> list[Candidate]:
        """The queue, best first (RRF, then first seen)."""
        return sorted(self.queue.values(), key=lambda c: (-c.rrf, c.first_seen))

    def head(self) -> Candidate | None:
        """The candidate the agent decides on."""
        return min(self.queue.values(), key=lambda c: (-c.rrf, c.first_seen), default=None)


# ---------------------------------------------------------------- observation

_GLOBAL = (
    "budget_used",
    "kept_chunks",
    "searches",
    "steps",
    "queued",
    "kept_best_overlap",
    "kept_sources",
    "has_head",
    "kept_best_match",
)
_CANDIDATE = (
    "bm25_score",
    "bm25_rank",
    "dense_score",
    "dense_rank",
    "rrf",
    "returned",
    "read",
    "title_overlap",
    "body_overlap",
    "names_identifier",
    "tokens",
    "fits",
    "same_source_as_kept",
    "position",
)
MATCH_FEATURES = (
    "doc_names_identifier",
    "title_names_identifier",
    "section_names_identifier",
    "identifiers_in_text",
    "identifier_count",
    "names_constant",
    "quotes_phrase",
    "names_version",
    "section_overlap",
    "text_overlap",
)
"""Names of :func:`match_features`' columns, in order (the hashed section buckets follow)."""
_MATCH_FLAGS = 8
"""The first columns of :data:`MATCH_FEATURES` that say whether the chunk names what the
question names (their mean is a chunk's ``kept_best_match``)."""
SECTION_BUCKETS = 8
"""Hashed buckets of a chunk's section-heading words ("ERRORS", "SYNOPSIS", "SEE ALSO" ...):
with the question's term buckets, what lets a policy learn which part of a page answers
which kind of question, on any corpus."""
_LOOKAHEAD = ("rrf", "bm25_rank", "dense_rank", "title_overlap", "tokens", "position")


_QUESTION = ("terms", "names_identifier", "quotes_phrase", "names_constant")
QUESTION_BUCKETS = 16
"""Hashed buckets of the question's key terms in the observation: a crude, corpus-free
signal of the question's type ("header", "error", "version" ...) a policy can condition on."""


def observation_features(lookahead: int) -> tuple[str, ...]:
    """Every observation column's name, in order."""
    question = tuple(f"question:{n}" for n in _QUESTION)
    buckets = tuple(f"question:term{i}" for i in range(QUESTION_BUCKETS))
    searched = tuple(f"searched:{r}:{f}" for r, f in ACTIONS.searches)
    head = tuple(f"head:{n}" for n in _CANDIDATE + MATCH_FEATURES)
    head += tuple(f"head:section{i}" for i in range(SECTION_BUCKETS))
    ahead = tuple(f"next{i}:{n}" for i in range(lookahead) for n in _LOOKAHEAD)
    return _GLOBAL + question + buckets + searched + head + ahead


def question_features(question: str) -> list[float]:
    """The question's own columns: its length, whether it names identifiers, quotes a phrase
    or names an upper-case constant (an errno, a flag), and its key terms hashed into
    :data:`QUESTION_BUCKETS` buckets (crc32: the same on every run and machine)."""
    terms = key_terms(question)
    names = identifiers(question)
    buckets = [0.0] * QUESTION_BUCKETS
    for term in terms:
        buckets[zlib.crc32(term.encode("utf-8")) % QUESTION_BUCKETS] = 1.0
    return [
        min(1.0, len(terms) / 20),
        float(bool(names)),
        float(bool(_QUOTED.search(question))),
        float(any(re.fullmatch(r"[A-Z][A-Z0-9_]{2,}", n) for n in names)),
        *buckets,
    ]


def chunk_position(chunk: Chunk) -> float:
    """Where the chunk lies in its document (its number in ``<source>#<n>``, /32, capped):
    man pages' NAME and SYNOPSIS come first, whatever the corpus."""
    _, _, number = chunk.id.rpartition("#")
    return min(1.0, int(number) / 32) if number.isdigit() else 0.0


@dataclass(frozen=True, slots=True)
class QuestionCues:
    """What a question names, in the forms a chunk's text is matched against."""

    terms: tuple[str, ...]
    """Its key terms (:func:`key_terms`)."""
    names: tuple[str, ...]
    """Its identifiers that are names (functions, modules, pages), lower-case."""
    constants: tuple[str, ...]
    """Its upper-case constants (an errno, a flag), as written."""
    phrases: tuple[str, ...]
    """Its quoted phrases, lower-case."""
    versions: tuple[str, ...]
    """Its version-like numbers ("3.9")."""


_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]{2,}")
_VERSION = re.compile(r"\b\d+\.\d+\b")
_DOC_EXTENSION = re.compile(r"\.(?:rst\.txt|rst|txt|md|markdown|html?|[1-9]\w*)$")
HEADING_SEPARATOR = " › "
"""Between the document title and the section titles in a chunk's heading line (the
chunker's format, :mod:`podium.context.corpus`)."""


def question_cues(question: str) -> QuestionCues:
    """The cues of ``question`` (once per episode)."""
    phrases = tuple((a or b).lower() for a, b in _QUOTED.findall(question))
    found = identifiers(question)
    constants = tuple(i for i in found if _CONSTANT.fullmatch(i))
    names = tuple(
        i.lower() for i in found if i not in constants and " " not in i and i.lower() not in phrases
    )
    return QuestionCues(
        tuple(key_terms(question)), names, constants, phrases, tuple(_VERSION.findall(question))
    )


def document_name(source: str) -> str:
    """A document's name as a question would name it: the file name without its directory,
    compression and extension (``man2/lseek.2.gz`` → ``lseek``, ``library/os.rst.txt`` →
    ``os``), lower-case."""
    base = source.rsplit("/", 1)[-1].removesuffix(".gz")
    return _DOC_EXTENSION.sub("", base).lower()


def _names_document(names: Sequence[str], document: str) -> bool:
    """Whether a name is the document's, whole or as the first or last part of a dotted
    name (``os.fsencode`` in ``os``; ``HMAC.update`` in a page named ``update``)."""
    return any(document in (n, n.split(".")[0], n.split(".")[-1]) for n in names)


def match_features(cues: QuestionCues, chunk: Chunk) -> list[float]:
    """How ``chunk``'s text matches what the question names (:data:`MATCH_FEATURES`'s columns, then
    :data:`SECTION_BUCKETS` hashed section-heading words). From the text alone — the file
    name, the heading line ("lseek(2) › SYNOPSIS") and the body — so they mean the same on
    any corpus the chunker cut, and never from the gold."""
    heading, _, body = chunk.text.partition("\n")
    title, _, section = heading.partition(HEADING_SEPARATOR)
    title, section, lower = title.lower(), section.lower(), chunk.text.lower()
    names = cues.names
    buckets = [0.0] * SECTION_BUCKETS
    for word in key_terms(section):
        buckets[zlib.crc32(word.encode("utf-8")) % SECTION_BUCKETS] = 1.0
    return [
        float(_names_document(names, document_name(chunk.source))),
        float(any(n in title for n in names)),
        float(any(n in section for n in names)),
        sum(1 for n in names if n in lower) / len(names) if names else 0.0,
        min(1.0, sum(body.lower().count(n) for n in names) / 5),
        float(any(c in chunk.text for c in cues.constants)),
        float(any(p in lower for p in cues.phrases)),
        float(any(v in chunk.text for v in cues.versions)),
        overlap(cues.terms, section),
        overlap(cues.terms, body),
        *buckets,
    ]


def match_strength(c: Candidate) -> float:
    """The mean of a candidate's name-match flags (the kept context's summary)."""
    return sum(c.match[:_MATCH_FLAGS]) / _MATCH_FLAGS if c.match else 0.0


OBSERVATION_FEATURES = observation_features(ContextEnvConfig().lookahead)
"""Column names with the default lookahead."""


def _rank_feature(c: Candidate, retriever: str, top_k: int) -> float:
    """1 for rank 0 falling to 1/top_k for the last rank; 0 when not returned."""
    rank = c.rank.get(retriever)
    return 0.0 if rank is None else 1.0 - rank / top_k


def candidate_features(c: Candidate | None, s: ContextState, cfg: ContextEnvConfig) -> list[float]:
    """The head's columns (zeros when the queue is empty)."""
    if c is None:
        return [0.0] * (len(_CANDIDATE) + len(MATCH_FEATURES) + SECTION_BUCKETS)
    searches = max(len(s.searched), 1)
    kept_sources = {k.chunk.source for k in s.kept}
    return [
        c.score.get("bm25", 0.0),
        _rank_feature(c, "bm25", cfg.top_k),
        c.score.get("dense", 0.0),
        _rank_feature(c, "dense", cfg.top_k),
        min(1.0, c.rrf * RRF_K / searches),
        c.returned / searches,
        float(c.read),
        c.title_overlap,
        c.body_overlap,
        float(c.names_identifier),
        min(1.0, c.tokens / cfg.budget_tokens),
        float(s.tokens_kept + c.tokens <= cfg.budget_tokens),
        float(c.chunk.source in kept_sources),
        chunk_position(c.chunk),
        *c.match,
    ]


def lookahead_features(c: Candidate | None, s: ContextState, cfg: ContextEnvConfig) -> list[float]:
    """One queued candidate after the head (zeros when there is none)."""
    if c is None:
        return [0.0] * len(_LOOKAHEAD)
    return [
        min(1.0, c.rrf * RRF_K / max(len(s.searched), 1)),
        _rank_feature(c, "bm25", cfg.top_k),
        _rank_feature(c, "dense", cfg.top_k),
        c.title_overlap,
        min(1.0, c.tokens / cfg.budget_tokens),
        chunk_position(c.chunk),
    ]


def observe(s: ContextState, cfg: ContextEnvConfig) -> NDArray[np.float32]:
    """The observation vector of state ``s`` (no gold in it: only what searches returned)."""
    ordered = s.ordered()
    head = ordered[0] if ordered else None
    rest: list[Candidate | None] = [*ordered[1 : 1 + cfg.lookahead]]
    rest += [None] * (cfg.lookahead - len(rest))
    values = [
        min(1.0, s.tokens_kept / cfg.budget_tokens),
        min(1.0, len(s.kept) / 10),
        min(1.0, len(s.searched) / cfg.max_searches),
        min(1.0, len(s.steps) / cfg.max_steps),
        min(1.0, len(ordered) / (cfg.top_k * len(ACTIONS.searches))),
        max((max(k.title_overlap, k.body_overlap) for k in s.kept), default=0.0),
        min(1.0, len({k.chunk.source for k in s.kept}) / 5),
        float(head is not None),
        max((match_strength(k) for k in s.kept), default=0.0),
        *s.question_features,
        *(float(pair in s.searched) for pair in ACTIONS.searches),
        *candidate_features(head, s, cfg),
        *(v for c in rest for v in lookahead_features(c, s, cfg)),
    ]
    return np.clip(np.asarray(values, dtype=np.float32), 0.0, 1.0)


# ---------------------------------------------------------------- the environment


class ContextEnv(gym.Env[NDArray[np.float32], np.int64]):
    """Search and prune for one question per episode (see the module docstring)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        index: SearchIndex,
        questions: Sequence[Question],
        config: ContextEnvConfig | None = None,
    ) -> None:
        if not questions:
            raise ConfigError("ContextEnv needs at least one question")
        self.index = index
        self.questions = list(questions)
        self._by_id = {q.id: q for q in self.questions}
        self.config = config or ContextEnvConfig()
        self.features = observation_features(self.config.lookahead)
        self.action_space = gym.spaces.Discrete(ACTIONS.size)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (len(self.features),), np.float32)
        self._state: ContextState | None = None
        self._retrieve: Mapping[str, Callable[[str, int], list[Hit]]] = {
            "bm25": index.bm25,
            "dense": index.dense,
        }

    @property
    def state(self) -> ContextState:
        """The episode in flight (:class:`ConfigError` before :meth:`reset`)."""
        if self._state is None:
            raise ConfigError("call reset() before using the environment")
        return self._state

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        """Start an episode: ``options={"question": id or Question}``, else one drawn."""
        super().reset(seed=seed)
        question = self._choose((options or {}).get("question"))
        self._state = ContextState(
            question=question,
            terms=key_terms(question.question),
            idents=[i.lower() for i in identifiers(question.question)],
            question_features=question_features(question.question),
            cues=question_cues(question.question),
            started=time.perf_counter(),
        )
        return observe(self._state, self.config), {"question_id": question.id}

    def _choose(self, choice: object) -> Question:
        if isinstance(choice, Question):
            return choice
        if choice is None:
            return self.questions[int(self.np_random.integers(len(self.questions)))]
        if isinstance(choice, str) and choice in self._by_id:
            return self._by_id[choice]
        raise ConfigError(f"question {choice!r} is not one of this environment's questions")

    def action_masks(self) -> NDArray[np.bool_]:
        """True where an action is valid now (the form sb3-contrib's MaskablePPO asks for)."""
        s, cfg = self.state, self.config
        mask = np.zeros(ACTIONS.size, dtype=np.bool_)
        mask[: len(ACTIONS.searches)] = len(s.searched) < cfg.max_searches
        head = s.head()
        mask[ACTIONS.read] = head is not None and not head.read
        mask[ACTIONS.keep] = head is not None and s.tokens_kept + head.tokens <= cfg.budget_tokens
        mask[ACTIONS.prune] = head is not None
        mask[ACTIONS.finish] = True
        return mask

    def step(
        self, action: int | np.integer[Any]
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        """Apply one action; reward only at the end (see the module docstring)."""
        s = self.state
        a = int(action)
        if not 0 <= a < ACTIONS.size:
            raise ConfigError(f"action {a} outside 0..{ACTIONS.size - 1}")
        if not self.action_masks()[a]:
            s.steps.append(ContextStep("invalid"))
        elif a < len(ACTIONS.searches):
            self._search(*ACTIONS.searches[a])
        elif a == ACTIONS.finish:
            s.steps.append(ContextStep("finish"))
            return self._end(truncated=False)
        else:
            self._decide(a)
        if len(s.steps) >= self.config.max_steps:
            return self._end(truncated=True)
        return observe(s, self.config), 0.0, False, False, {}

    def _search(self, retriever: str, form: str) -> None:
        s, cfg = self.state, self.config
        query = make_query(s.question.question, form)
        began = time.perf_counter()
        results = self._retrieve[retriever](query, cfg.top_k)
        took = time.perf_counter() - began
        s.search_s += took
        s.searched.append((retriever, form))
        fresh = add_hits(s, results, retriever)
        s.steps.append(
            ContextStep(
                "search",
                retriever=retriever,
                form=form,
                query=query,
                new_candidates=fresh,
                latency_s=took,
            )
        )

    def _decide(self, action: int) -> None:
        s = self.state
        head = s.head()
        assert head is not None  # the mask allowed it
        chunk = head.chunk
        if action == ACTIONS.read:
            head.read = True
            head.body_overlap = overlap(s.terms, chunk.text)
            text = chunk.text.lower()
            head.names_identifier = any(i in text for i in s.idents)
            s.steps.append(chunk_step("read", head))
            return
        del s.queue[chunk.id]
        s.decided.add(chunk.id)
        kind: StepKind = "keep" if action == ACTIONS.keep else "prune"
        if kind == "keep":
            s.kept.append(head)
            s.tokens_kept += head.tokens
        s.steps.append(chunk_step(kind, head))

    def _end(
        self, *, truncated: bool
    ) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        s = self.state
        episode = ContextEpisode(
            question_id=s.question.id,
            budget_tokens=self.config.budget_tokens,
            steps=tuple(s.steps),
            gold=s.question.gold,
            wall_s=time.perf_counter() - s.started,
        )
        reward = context_reward(episode, self.config.reward)
        info = {
            "answer_found": episode.answer_found,
            "precision": episode.precision,
            "gold_recall": episode.gold_recall,
            "tokens_kept": episode.tokens_kept,
            "searches": episode.searches,
            "wall_s": episode.wall_s,
            "search_s": s.search_s,
            "kept": [c.chunk.id for c in s.kept],
            "reward": reward,
            "episode": episode,
        }
        return observe(s, self.config), reward.total, not truncated, truncated, info


def chunk_step(kind: StepKind, c: Candidate) -> ContextStep:
    """The record of a read, keep or prune of ``c``: where its chunk lies, so the reward
    can check it against the gold."""
    chunk = c.chunk
    return ContextStep(
        kind,
        chunk_id=chunk.id,
        source=chunk.source,
        start=chunk.start,
        end=chunk.end,
        tokens=c.tokens,
        read=c.read and kind != "read",
    )


def add_hits(s: ContextState, results: Sequence[Hit], retriever: str) -> int:
    """Merge one search's hits into the queue; returns how many chunks were new to it."""
    best = max((h.score for h in results), default=0.0)
    fresh = 0
    for hit in results:
        cid = hit.chunk.id
        if cid in s.decided:
            continue
        c = s.queue.get(cid)
        if c is None:
            tokens = count_tokens(hit.chunk.text)
            c = Candidate(hit.chunk, tokens, first_seen=s.seen)
            s.seen += 1
            c.title_overlap = overlap(s.terms, title_of(hit.chunk))
            c.match = match_features(s.cues, hit.chunk)
            s.queue[cid] = c
            fresh += 1
        # BM25 scores are unbounded: normalise by the search's best so features compare
        # across queries; dense cosine is already in [-1, 1].
        norm = hit.score / best if retriever == "bm25" and best > 0 else hit.score
        c.score[retriever] = max(c.score.get(retriever, 0.0), float(norm))
        c.rank[retriever] = min(c.rank.get(retriever, hit.rank), hit.rank)
        c.rrf += 1.0 / (RRF_K + hit.rank + 1)
        c.returned += 1
    return fresh


def make_context_env(
    index: SearchIndex | str | Path,
    questions: Sequence[Question] | str | Path,
    config: ContextEnvConfig | Mapping[str, Any] | None = None,
    *,
    chroma_url: str | None = None,
    cache_searches: bool = False,
) -> ContextEnv:
    """:class:`ContextEnv` as ``gymnasium.make("podium/Context-v0", ...)`` builds it: ``index``
    an opened index or an index directory (:meth:`ContextIndex.open`, with ``chroma_url``
    when its vectors live on a server), ``questions`` a list or a question file, ``config``
    a :class:`ContextEnvConfig` or a dict of its fields (unknown ones named);
    ``cache_searches`` wraps the index in a :class:`CachedIndex` (training)."""
    if isinstance(index, str | Path):
        index = ContextIndex.open(Path(index), chroma_url=chroma_url)
    if cache_searches:
        index = CachedIndex(index)
    if isinstance(questions, str | Path):
        questions = load_questions(questions)
    return ContextEnv(index, questions, resolve_env_config(config))


def resolve_env_config(config: ContextEnvConfig | Mapping[str, Any] | None) -> ContextEnvConfig:
    """A :class:`ContextEnvConfig` as given, the default, or built from a dict of its fields."""
    if config is None or isinstance(config, ContextEnvConfig):
        return config or ContextEnvConfig()
    known = {f.name for f in fields(ContextEnvConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ConfigError(
            f"ContextEnvConfig has no field {', '.join(map(repr, unknown))} "
            f"(fields: {', '.join(sorted(known))})"
        )
    return ContextEnvConfig(**config)
