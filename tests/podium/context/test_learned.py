"""The learned Context-1 agent's weights: saved, verified, loaded and played like a heuristic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from podium.context.env import ACTIONS, ContextEnv, ContextEnvConfig, observation_features
from podium.context.generate import all_questions, generate
from podium.context.heuristics import run_episode
from podium.context.index import ContextIndex
from podium.context.learned import (
    LearnedPolicy,
    load_learned_policy,
    policy_observation,
    save_learned_policy,
)
from podium.context.questions import Question
from podium.errors import ArtifactError, ConfigError
from podium.policy.artifacts import publish_weights
from podium.rl.networks import ActorCritic

FIXTURES = Path(__file__).parent / "fixtures" / "c-docs"
ROOTS = [FIXTURES / "python", FIXTURES / "man"]
CONFIG = ContextEnvConfig(budget_tokens=300, top_k=5, max_searches=4, max_steps=30)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> ContextIndex:
    return ContextIndex.build(ROOTS, tmp_path_factory.mktemp("ctx") / "index")


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    return list(all_questions(generate(ROOTS)))


def finisher(features: tuple[str, ...]) -> ActorCritic:
    """A network that searches BM25 with the question, keeps the head, and finishes only
    when nothing else is valid: its biases rank search > keep > finish."""
    torch.manual_seed(0)
    model = ActorCritic(len(features), ACTIONS.size)
    with torch.no_grad():
        head = model.actor[-1]
        assert isinstance(head, torch.nn.Linear)
        head.weight.zero_()
        head.bias.fill_(-5.0)
        head.bias[ACTIONS.search("bm25", "question")] = 3.0
        head.bias[ACTIONS.keep] = 2.0
        head.bias[ACTIONS.finish] = 0.0
    return model


def test_saved_policy_loads_and_plays_like_a_heuristic(
    tmp_path: Path, index: ContextIndex, questions: list[Question]
) -> None:
    env = ContextEnv(index, questions, CONFIG)
    ref = save_learned_policy(finisher(env.features), env.features, tmp_path, "context", 1)
    for path in (ref.path, ref.path.parent):  # the file or its version directory
        policy = load_learned_policy(path)
        assert isinstance(policy, LearnedPolicy)
        assert policy.name == "learned"
        info = run_episode(env, policy, questions[0])
        # Search once (repeating is masked only by max_searches: the greedy net repeats
        # until the mask stops it), then keep while the head fits, then finish.
        names = [ACTIONS.name(a) for a in info["actions"]]
        assert names[: CONFIG.max_searches] == ["search:bm25:question"] * CONFIG.max_searches
        assert "keep" in names and names[-1] == "finish"
        assert 0 < info["tokens_kept"] <= CONFIG.budget_tokens
        assert run_episode(env, policy, questions[0])["actions"] == info["actions"]
    obs = policy_observation(env)
    assert obs.shape == (len(env.features),) and obs.dtype == np.float32


def test_weights_for_another_observation_are_refused(
    tmp_path: Path, index: ContextIndex, questions: list[Question]
) -> None:
    other = observation_features(lookahead=1)
    ref = save_learned_policy(finisher(other), other, tmp_path, "context", 1)
    policy = load_learned_policy(ref.path)
    env = ContextEnv(index, questions, CONFIG)  # lookahead 3: more columns
    env.reset(options={"question": questions[0]})
    with pytest.raises(ConfigError, match=r"observation columns.*next1:rrf"):
        policy.act(env)


def test_bad_files_are_named(tmp_path: Path) -> None:
    features = observation_features(ContextEnvConfig().lookahead)
    with pytest.raises(ArtifactError, match="cannot read hash file"):
        load_learned_policy(tmp_path / "absent.safetensors")
    ref = save_learned_policy(finisher(features), features, tmp_path, "context", 1)
    data = bytearray(ref.path.read_bytes())
    data[-1] ^= 0xFF
    ref.path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        load_learned_policy(ref.path)
    plain = ActorCritic(4, 2)
    other = publish_weights(
        plain.state_dict(), tmp_path, "cartpole", 1, metadata=plain.architecture()
    )
    with pytest.raises(ConfigError, match="not podium/Context-v0"):
        load_learned_policy(other.path)
