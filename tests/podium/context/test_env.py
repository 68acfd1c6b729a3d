"""The Context-1 environment on a real index (bm25s + embedded Chroma) of trimmed real docs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import podium.envs
from podium.context.corpus import Chunk
from podium.context.env import (
    ACTIONS,
    MATCH_FEATURES,
    QUESTION_BUCKETS,
    SECTION_BUCKETS,
    CachedIndex,
    ContextEnv,
    ContextEnvConfig,
    chunk_position,
    document_name,
    identifiers,
    key_terms,
    make_query,
    match_features,
    question_cues,
    question_features,
)
from podium.context.generate import all_questions, generate
from podium.context.heuristics import BASELINES, SelectivePolicy, TopKPolicy, run_episode
from podium.context.index import ContextIndex
from podium.context.questions import GoldSpan, Question, write_questions
from podium.context.scoring import score_context
from podium.errors import ConfigError
from podium.rewards.context import (
    SEARCH_LOOP,
    context_reward,
    episode_trajectory,
    score_context_trajectory,
    trajectory_episode,
)

FIXTURES = Path(__file__).parent / "fixtures" / "c-docs"
ROOTS = [FIXTURES / "python", FIXTURES / "man"]
CONFIG = ContextEnvConfig(budget_tokens=300, top_k=5, max_searches=4, max_steps=30)
BM25_Q = ACTIONS.search("bm25", "question")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> ContextIndex:
    return ContextIndex.build(ROOTS, tmp_path_factory.mktemp("ctx") / "index")


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return list(all_questions(generate(ROOTS)))


@pytest.fixture
def env(index: ContextIndex, questions: list[Question]) -> ContextEnv:
    return ContextEnv(index, questions, CONFIG)


def by_text(questions: list[Question], text: str) -> Question:
    return next(q for q in questions if q.question == text)


def test_query_forms() -> None:
    q = "What does the error EACCES mean for open(2)?"
    assert make_query(q, "question") == q
    assert make_query(q, "keywords") == "error eacces mean open 2"
    assert make_query(q, "identifier") == "EACCES open"
    assert identifiers("In which Python version was os.fsencode() added?") == ["os.fsencode"]
    assert identifiers(
        "Which page listed under SEE ALSO in open(2) is about 'reposition read/write file offset'?"
    ) == ["open", "reposition read/write file offset"]
    assert make_query("How are you?", "identifier") == make_query("How are you?", "keywords")
    assert key_terms("The the THE os.path") == ["os.path"]
    with pytest.raises(ConfigError, match="query form 'bogus'"):
        make_query(q, "bogus")


def test_question_features_tell_question_types_apart() -> None:
    header = question_features("Which header declares lseek()?")
    errno = question_features("What does the error EACCES mean for open(2)?")
    faq = question_features("Is there a curses/termcap package for Python?")
    assert len(header) == len(errno) == 4 + QUESTION_BUCKETS
    assert header[1:4] == [1.0, 0.0, 0.0]  # names an identifier, no quote, no constant
    assert errno[1:4] == [1.0, 0.0, 1.0]
    assert faq[1:4] == [0.0, 0.0, 0.0]
    assert header[4:] != errno[4:]
    assert question_features("Which header declares lseek()?") == header  # stable
    chunk = Chunk(id="man2/lseek.2.gz#2", source="man2/lseek.2.gz", start=0, end=1, text="x")
    assert chunk_position(chunk) == 2 / 32


def test_question_cues_split_what_a_question_names() -> None:
    errno = question_cues("What does the error ENOMEM mean for epoll_create(2)?")
    assert (errno.names, errno.constants, errno.phrases) == (("epoll_create",), ("ENOMEM",), ())
    seealso = question_cues("Which page listed under SEE ALSO in read(2) is about 'read from fd'?")
    assert (seealso.names, seealso.phrases) == (("read",), ("read from fd",))
    version = question_cues("What changed in bytes.decode() in Python 3.9?")
    assert (version.names, version.versions) == (("bytes.decode",), ("3.9",))
    assert question_cues("Why are Python strings immutable?").names == ()


def test_document_names_drop_directory_compression_and_extension() -> None:
    assert document_name("man2/lseek.2.gz") == "lseek"
    assert document_name("library/os.rst.txt") == "os"
    assert document_name("guide/Setup.md") == "setup"
    assert document_name("README") == "readme"


def _chunk(source: str, text: str) -> Chunk:
    return Chunk(id=f"{source}#3", source=source, start=0, end=len(text), text=text)


def test_match_features_tell_the_answering_chunk_from_its_neighbours() -> None:
    """The errno item of the page the question names matches on every cue; the same page's
    other sections and another page's ERRORS do not."""
    cues = question_cues("What does the error ENOMEM mean for epoll_create(2)?")
    names = "doc_names_identifier", "title_names_identifier", "names_constant"
    column = {n: i for i, n in enumerate(MATCH_FEATURES)}
    gold = match_features(
        cues, _chunk("man2/epoll_create.2.gz", "epoll_create(2) › ERRORS\nENOMEM No memory.")
    )
    same_page = match_features(
        cues, _chunk("man2/epoll_create.2.gz", "epoll_create(2) › NAME\nepoll_create - open")
    )
    other = match_features(cues, _chunk("man2/mmap.2.gz", "mmap(2) › ERRORS\nENOMEM No memory."))
    assert len(gold) == len(column) + SECTION_BUCKETS
    assert all(gold[column[n]] == 1.0 for n in names)
    assert same_page[column["names_constant"]] == 0.0
    assert other[column["doc_names_identifier"]] == other[column["title_names_identifier"]] == 0
    assert other[column["names_constant"]] == 1.0
    # The section heading's words land in buckets: ERRORS and NAME differ, ERRORS is ERRORS.
    assert gold[len(column) :] == other[len(column) :] != same_page[len(column) :]
    phrase = question_cues("Which page listed under SEE ALSO in lseek(2) is about 'open a file'?")
    hit = match_features(phrase, _chunk("man2/open.2.gz", "open(2) › NAME\nopen - open a file"))
    assert hit[column["quotes_phrase"]] == 1.0
    version = question_cues("What changed in os.fsencode() in Python 3.6?")
    text = "os --- Miscellaneous › Files\nos.fsencode(f) Changed in version 3.6."
    found = match_features(version, _chunk("library/os.rst.txt", text))
    assert found[column["doc_names_identifier"]] == found[column["names_version"]] == 1.0


def test_the_observation_shows_the_heads_match(env: ContextEnv, questions: list[Question]) -> None:
    q = by_text(questions, "What does the error EACCES mean for open(2)?")
    obs, _ = env.reset(options={"question": q})
    assert obs[env.features.index("head:doc_names_identifier")] == 0.0  # nothing queued yet
    obs = env.step(BM25_Q)[0]
    head = env.state.head()
    assert head is not None and head.match
    assert obs[env.features.index("head:doc_names_identifier")] == float(
        head.chunk.source.startswith("man2/open.")
    )
    while "EACCES" not in head.chunk.text:
        obs = env.step(ACTIONS.prune)[0]
        head = env.state.head()
        assert head is not None, "BM25 returned no chunk naming EACCES"
    assert obs[env.features.index("head:names_constant")] == 1.0
    assert obs[env.features.index("kept_best_match")] == 0.0
    obs = env.step(ACTIONS.keep)[0]
    assert obs[env.features.index("kept_best_match")] > 0.0


def test_passes_gymnasiums_checker(env: ContextEnv) -> None:
    check_env(env, skip_render_check=True)


def test_registered_make_reads_an_index_directory_and_a_question_file(
    index: ContextIndex, questions: list[Question], tmp_path: Path
) -> None:
    path = tmp_path / "q.jsonl"
    write_questions(path, questions)
    assert podium.envs.registration.CONTEXT_ENV_ID == "podium/Context-v0"
    env = gymnasium.make(
        "podium/Context-v0", index=index.path, questions=path, config={"budget_tokens": 200}
    )
    inner = env.unwrapped
    assert isinstance(inner, ContextEnv)
    assert inner.config.budget_tokens == 200 and len(inner.questions) == len(questions)
    with pytest.raises(ConfigError, match="no field 'budget'"):
        gymnasium.make("podium/Context-v0", index=index, questions=questions, config={"budget": 1})


def test_observation_never_holds_the_gold(index: ContextIndex, questions: list[Question]) -> None:
    """Two questions that differ only in their gold are indistinguishable to the agent."""
    real = by_text(questions, "Which header declares lseek()?")
    fake = replace(real, id="fake", gold=(GoldSpan("man2/open.2", 0, 10),))
    env = ContextEnv(index, [real, fake], CONFIG)
    # BM25 ranks lseek(2)'s NAME chunk first and its SYNOPSIS (the gold) second.
    plan = [BM25_Q, ACTIONS.read, ACTIONS.keep, ACTIONS.keep, ACTIONS.search("dense", "identifier")]
    seen = []
    for q in (real, fake):
        obs, _ = env.reset(options={"question": q.id})
        rows = [obs] + [env.step(a)[0] for a in plan]
        seen.append(np.stack(rows))
        final = env.step(ACTIONS.finish)[4]
        assert final["answer_found"] is (q is real)
    np.testing.assert_array_equal(seen[0], seen[1])


def test_search_read_keep_finish(env: ContextEnv, questions: list[Question]) -> None:
    q = by_text(questions, "Which header declares lseek()?")
    env.reset(options={"question": q})
    obs, reward, terminated, truncated, info = env.step(BM25_Q)
    assert (reward, terminated, truncated, info) == (0.0, False, False, {})
    s = env.state
    assert s.searched == [("bm25", "question")] and 0 < len(s.queue) <= CONFIG.top_k
    assert s.steps[-1].latency_s > 0 and s.steps[-1].new_candidates == len(s.queue)
    head = s.head()
    assert head is not None and head.chunk.source == "man2/lseek.2.gz"  # BM25 finds the page
    assert obs[env.features.index("head:read")] == 0.0
    obs = env.step(ACTIONS.read)[0]
    assert obs[env.features.index("head:read")] == 1.0
    assert obs[env.features.index("head:body_overlap")] > 0
    env.step(ACTIONS.keep)
    second = s.head()
    assert second is not None and second.chunk.text.split("\n")[0].endswith("SYNOPSIS")
    env.step(ACTIONS.keep)
    _, reward, terminated, _, info = env.step(ACTIONS.finish)
    assert terminated and info["answer_found"]
    assert info["kept"] == [head.chunk.id, second.chunk.id]
    assert info["searches"] == 1 and info["tokens_kept"] == head.tokens + second.tokens
    assert info["wall_s"] >= info["search_s"] > 0
    expected = score_context([head.chunk, second.chunk], q.gold)
    assert expected.precision == 0.5
    assert (info["precision"], info["gold_recall"]) == (expected.precision, expected.gold_recall)
    assert reward == pytest.approx(context_reward(info["episode"], CONFIG.reward).total)
    # What reward_svc will receive scores the same as the environment scored it.
    traj = episode_trajectory(info["episode"], trajectory_id="t")
    assert trajectory_episode(traj) == info["episode"]
    assert score_context_trajectory(traj, CONFIG.reward).total == pytest.approx(reward)


def test_over_budget_keep_is_invalid_and_charged(
    index: ContextIndex, questions: list[Question]
) -> None:
    env = ContextEnv(index, questions, replace(CONFIG, budget_tokens=5))
    env.reset(options={"question": questions[0].id})
    env.step(BM25_Q)
    assert not env.action_masks()[ACTIONS.keep] and env.action_masks()[ACTIONS.prune]
    env.step(ACTIONS.keep)
    assert env.state.steps[-1].kind == "invalid" and not env.state.kept
    info = env.step(ACTIONS.finish)[4]
    assert info["reward"].components["invalid"] < 0


def test_repeated_search_is_a_loop_in_the_reward(
    env: ContextEnv, questions: list[Question]
) -> None:
    env.reset(options={"question": questions[0].id})
    for _ in range(3):
        env.step(BM25_Q)
    assert env.state.steps[-1].new_candidates == 0
    info = env.step(ACTIONS.finish)[4]
    assert info["reward"].penalties[SEARCH_LOOP] > 0


def test_truncation_scores_the_episode(index: ContextIndex, questions: list[Question]) -> None:
    env = ContextEnv(index, questions, replace(CONFIG, max_steps=3))
    env.reset(options={"question": questions[0].id})
    results = [env.step(BM25_Q) for _ in range(3)]
    _, reward, terminated, truncated, info = results[-1]
    assert (terminated, truncated) == (False, True)
    assert reward == info["reward"].total and info["searches"] == 3


def test_baselines_fill_the_budget_in_rank_order(
    env: ContextEnv, questions: list[Question]
) -> None:
    hybrid = next(p for p in BASELINES if p.name == "hybrid")
    for q in questions:
        info = run_episode(env, hybrid, q)
        assert info["tokens_kept"] <= CONFIG.budget_tokens
        assert [a for a in info["actions"] if a < ACTIONS.read] == [
            ACTIONS.search("bm25", "question"),
            ACTIONS.search("dense", "question"),
        ]
    found = [run_episode(env, p, q)["answer_found"] for p in BASELINES for q in questions]
    assert sum(found) / len(found) > 0.8  # a tiny corpus: the baselines find most answers


def test_selective_policy_reads_before_it_decides(
    env: ContextEnv, questions: list[Question]
) -> None:
    q = by_text(questions, "What does the error EACCES mean for open(2)?")
    info = run_episode(env, SelectivePolicy(), q)
    assert info["answer_found"]
    kinds = [s.kind for s in info["episode"].steps]
    assert kinds.count("read") >= kinds.count("keep") + kinds.count("prune") > 0
    assert all(s.read for s in info["episode"].steps if s.kind in ("keep", "prune"))
    narrow = run_episode(env, TopKPolicy("bm25", (("bm25", "question"),)), q)
    assert info["precision"] >= narrow["precision"]


def test_cached_index_answers_repeats_without_searching_again(
    index: ContextIndex, questions: list[Question]
) -> None:
    cached = CachedIndex(index)
    env = ContextEnv(cached, questions, CONFIG)
    hybrid = next(p for p in BASELINES if p.name == "hybrid")
    first = [run_episode(env, hybrid, q) for q in questions[:3]]
    assert (cached.hits, cached.misses) == (0, 6)
    again = [run_episode(env, hybrid, q) for q in questions[:3]]
    assert (cached.hits, cached.misses) == (6, 6)
    assert [i["kept"] for i in again] == [i["kept"] for i in first]
    assert cached.dense("lseek", 3) == index.dense("lseek", 3)
