"""Heuristic policies of the context environment: the baselines and the teacher.

Each policy decides from the environment's state (:attr:`ContextEnv.state`) — what searches
returned and what the agent has read — never from the gold. They are

* :class:`TopKPolicy`: make a fixed plan of searches, then keep the queue's head in RRF
  order while it fits the budget. Searching the question as is with BM25 or dense alone is
  the BM25 / dense top-k baseline at the budget; with both, the hybrid (reciprocal rank
  fusion) baseline (:data:`BASELINES`).
* :class:`SelectivePolicy`: the hybrid searches plus an identifier search, then *read* each
  head and keep it only when it shares enough of the question's terms or names its
  identifier, pruning the rest; the richest heuristic (it uses the read, prune and
  query-form actions), which ``podium train --env context`` clones when told to clone a
  heuristic (by default it clones a teacher that sees the gold).

:func:`run_episode` plays one question with any policy (the loop a benchmark and a
behaviour-cloning data collector share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from podium.context.env import ACTIONS, ContextEnv
from podium.context.questions import Question


class ContextPolicy(Protocol):
    """Anything that picks the next action of a :class:`ContextEnv`."""

    @property
    def name(self) -> str:
        """The policy's name in reports."""
        ...

    def act(self, env: ContextEnv) -> int:
        """The next action's index."""
        ...


def next_search(env: ContextEnv, plan: Sequence[tuple[str, str]]) -> int | None:
    """The first search of ``plan`` not yet made (None when all were, or none may be)."""
    if not env.action_masks()[0]:
        return None
    done = set(env.state.searched)
    for retriever, form in plan:
        if (retriever, form) not in done:
            return ACTIONS.search(retriever, form)
    return None


def fill_or_finish(env: ContextEnv, fill: float) -> int:
    """Keep the head if it fits; finish when the budget is ``fill`` full or nothing is
    queued; otherwise prune the head (it does not fit, a later one may)."""
    s, budget = env.state, env.config.budget_tokens
    head = s.head()
    if head is None or s.tokens_kept >= fill * budget:
        return ACTIONS.finish
    if s.tokens_kept + head.tokens <= budget:
        return ACTIONS.keep
    return ACTIONS.prune


@dataclass(frozen=True, slots=True)
class TopKPolicy:
    """Make the searches of ``plan``, then keep in fused rank order up to the budget."""

    name: str
    plan: tuple[tuple[str, str], ...]
    """(retriever, query form) of each search, in order."""
    fill: float = 0.95
    """Budget fraction at which the context counts as full."""

    def act(self, env: ContextEnv) -> int:
        """Search first, then fill the budget."""
        search = next_search(env, self.plan)
        return search if search is not None else fill_or_finish(env, self.fill)


@dataclass(frozen=True, slots=True)
class SelectivePolicy:
    """Hybrid and identifier searches; read every head, keep the relevant ones."""

    name: str = "selective"
    min_overlap: float = 0.5
    """Body term overlap with the question at which a read chunk is kept."""
    plan: tuple[tuple[str, str], ...] = (
        ("bm25", "question"),
        ("dense", "question"),
        ("bm25", "identifier"),
    )
    fill: float = 0.95

    def act(self, env: ContextEnv) -> int:
        """Search the plan, then read, then keep or prune each head."""
        search = next_search(env, self.plan)
        if search is not None:
            return search
        s = env.state
        head = s.head()
        if head is None or s.tokens_kept >= self.fill * env.config.budget_tokens:
            return ACTIONS.finish
        if not head.read:
            return ACTIONS.read
        relevant = head.names_identifier or head.body_overlap >= self.min_overlap
        if relevant and s.tokens_kept + head.tokens <= env.config.budget_tokens:
            return ACTIONS.keep
        return ACTIONS.prune


BASELINES: tuple[TopKPolicy, ...] = (
    TopKPolicy("bm25", (("bm25", "question"),)),
    TopKPolicy("dense", (("dense", "question"),)),
    TopKPolicy("hybrid", (("bm25", "question"), ("dense", "question"))),
)
"""The benchmark's baselines at the same budget: BM25, dense and hybrid (RRF) top-k."""


def run_episode(env: ContextEnv, policy: ContextPolicy, question: Question | str) -> dict[str, Any]:
    """Play ``question`` to its end with ``policy``; returns the final ``info`` (scores,
    latency, the reward breakdown and the episode record) plus ``actions`` taken."""
    env.reset(options={"question": question})
    actions: list[int] = []
    while True:
        action = policy.act(env)
        actions.append(action)
        _obs, _reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return {**info, "actions": actions}
