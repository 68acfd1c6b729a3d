"""``podium train --env context``: cloning, PPO through reward_svc and the learning loop on a
real index (bm25s + embedded Chroma) of trimmed real docs, and the learned agent it leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from podium import rewards
from podium.context.env import ACTIONS, CachedIndex, ContextEnv, ContextEnvConfig
from podium.context.generate import all_questions, generate
from podium.context.heuristics import SelectivePolicy, next_search, run_episode
from podium.context.index import ContextIndex
from podium.context.learned import LearnedPolicy, load_learned_policy
from podium.context.questions import write_questions
from podium.errors import ConfigError
from podium.rewards.context import episode_trajectory
from podium.rl.networks import ActorCritic
from podium_app.train.context import (
    ContextTrainConfig,
    GoldTeacher,
    clone,
    demonstrate,
    load_splits,
    merge,
    reward_config,
    split_of,
)
from podium_app.train.context_cli import bar_fields
from podium_app.train.context_run import run_env, train_context

FIXTURES = Path(__file__).parents[2] / "podium" / "context" / "fixtures" / "c-docs"
ROOTS = [FIXTURES / "python", FIXTURES / "man"]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ctx") / "index"
    ContextIndex.build(ROOTS, out)
    return out


@pytest.fixture(scope="module")
def question_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("q") / "questions.jsonl"
    write_questions(path, all_questions(generate(ROOTS)))
    return path


def test_splits_of_a_file_are_stable_and_a_directory_needs_all_three(
    tmp_path: Path, question_file: Path
) -> None:
    splits = load_splits(question_file)
    assert sum(len(s) for s in splits.values()) == len(question_file.read_text().splitlines())
    assert all(split_of(q.id) == name for name, qs in splits.items() for q in qs)
    (tmp_path / "train.jsonl").write_text(question_file.read_text())
    with pytest.raises(ConfigError, match=r"no validation.jsonl, held-out.jsonl"):
        load_splits(tmp_path)
    with pytest.raises(ConfigError, match="--budget must be >= 1"):
        ContextTrainConfig(index=tmp_path, questions=tmp_path, budget_tokens=0)


def test_the_run_env_rewards_with_the_reward_configs_context_section(
    tmp_path: Path, index: Path, question_file: Path
) -> None:
    # A reward YAML whose context weights differ from the defaults: the environment's own
    # reward (the actor's return) must be what reward_svc scores with that file, not the
    # dataclass defaults.
    data = yaml.safe_load(_default_yaml())
    data["context"].update(found=3.0, precision=1.5, turn=0.05, tokens=0.7)
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = ContextTrainConfig(
        index=index, questions=question_file, run_dir=tmp_path / "run", reward_config=path
    )
    reward = reward_config(cfg)
    assert reward.context.found == 3.0 and reward.context.turn == 0.05
    questions = load_splits(question_file)["validation"]
    env = run_env(cfg, questions, reward)
    info = run_episode(env, SelectivePolicy(), questions[0])
    traj = episode_trajectory(info["episode"], trajectory_id="t")
    assert info["reward"].total == pytest.approx(rewards.score(traj, reward, 0.0).total)
    default = rewards.score(traj, rewards.default_config(), 0.0).total
    assert info["reward"].total != pytest.approx(default)
    # Without a file: the packaged default, as reward_svc's in this run.
    assert reward_config(ContextTrainConfig(index=index, questions=question_file)) == (
        rewards.default_config()
    )
    path.write_text("context: {found: -1}\n")
    with pytest.raises(ConfigError, match=r"--reward-config: reward config .*context.found"):
        reward_config(cfg)


def _default_yaml() -> str:
    from importlib import resources

    return resources.files("podium").joinpath("data/rewards/default.yaml").read_text("utf-8")


async def test_train_context_clones_learns_through_the_services_and_leaves_a_policy(
    tmp_path: Path, index: Path, question_file: Path
) -> None:
    cfg = ContextTrainConfig(
        index=index,
        questions=question_file,
        run_dir=tmp_path / "run",
        iterations=2,
        episodes_per_iteration=24,
        bc_epochs=60,
        eval_every=1,
        minibatch_size=64,
    )
    events: list[tuple[str, dict[str, float]]] = []
    result = await train_context(cfg, lambda phase, f: events.append((phase, dict(f))))
    phases = [p for p, _ in events]
    assert {"bc", "ppo", "eval"} <= set(phases)
    # The bar tells each DAgger round (a minute each on a real corpus) and then the clone.
    rounds = [f["dagger_round"] for p, f in events if "dagger_round" in f]
    assert rounds == [1.0, 2.0]
    assert "DAgger round 2" in bar_fields("bc", {"dagger_round": 2.0}, 2)["figures"]
    # The gold teacher is cloned, then refined by DAgger rounds on the clone's own states;
    # cloning learns its decisions (14 training questions are too few for the clone to match
    # it on validation: test_the_clone_of_the_gold_teacher_... checks that on training).
    assert result.teacher == "gold"
    assert {h["round"] for h in result.bc_history} == {0.0, 1.0, 2.0}
    assert result.bc_history[-1]["bc_accuracy"] > 0.9
    best_heuristic = max(v["answer_found"] for k, v in result.validation.items() if k != "gold")
    assert result.validation["gold"]["answer_found"] >= best_heuristic
    # Versions 0 (cloned), 1 and 2 came back from the learner, each validated.
    assert [h["iteration"] for h in result.history] == [0.0, 1.0, 2.0]
    assert all("val_answer_found" in h for h in result.history)
    # The learner's return is reward_svc's context reward of the actor's episodes: the
    # trajectories went through the scoring service, not around it.
    for row in result.history[1:]:
        assert row["return"] == pytest.approx(row["reward"], abs=1e-4)
    versions = sorted((cfg.run_dir / "checkpoints" / "context").iterdir())
    assert [v.name for v in versions] == ["0", "1", "2"]
    assert (versions[0] / "weights.safetensors").read_bytes() != (
        versions[2] / "weights.safetensors"
    ).read_bytes()
    # The result loads as the benchmark's `learned` policy and plays an episode.
    policy = load_learned_policy(result.policy)
    env = ContextEnv(
        ContextIndex.open(index),
        load_splits(question_file)["held-out"],
        ContextEnvConfig(budget_tokens=cfg.budget_tokens),
    )
    info = run_episode(env, policy, env.questions[0])
    assert info["tokens_kept"] <= cfg.budget_tokens
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert set(summary["held_out"]) == {"bm25", "dense", "hybrid", "selective", "learned"}
    assert summary["teacher"] == result.teacher
    for name in ("report.html", "learning_curve.png", "policies.png"):
        assert (cfg.run_dir / name).stat().st_size > 0
    assert any((cfg.run_dir / "tb").iterdir())
    # A second run in the same directory would resume the first's learner: refused.
    with pytest.raises(ConfigError, match="holds a previous run"):
        await train_context(cfg)


class PruneAll:
    """A driver that makes the gold teacher's searches and prunes every candidate."""

    name = "prune-all"

    def act(self, env: ContextEnv) -> int:
        search = next_search(env, GoldTeacher().plan)
        if search is not None:
            return search
        return ACTIONS.prune if env.state.head() is not None else ACTIONS.finish


def test_the_clone_of_the_gold_teacher_finds_what_the_teacher_keeps(
    index: Path, question_file: Path
) -> None:
    """The gold teacher keeps exactly the answering chunk; DAgger records its labels on the
    states a driver reaches; a clone fitted on its decisions reproduces it."""
    train = load_splits(question_file)["train"]
    env = ContextEnv(
        CachedIndex(ContextIndex.open(index)), train, ContextEnvConfig(budget_tokens=300)
    )
    teacher = GoldTeacher()
    rows = [run_episode(env, teacher, q) for q in train]
    assert all(bool(r["kept"]) == r["answer_found"] for r in rows)
    assert all(r["precision"] == float(r["answer_found"]) for r in rows)
    taught = sum(r["answer_found"] for r in rows) / len(rows)
    assert taught >= 0.9
    # DAgger: the driver's actions are played (it keeps nothing, so every return is that of
    # an empty context) and the teacher's are the labels (it would have kept the gold).
    driven = demonstrate(env, teacher, train, driver=PruneAll())
    assert ACTIONS.keep in driven.actions
    assert driven.actions.count(ACTIONS.keep) >= sum(len(r["kept"]) for r in rows)
    empty = run_episode(env, PruneAll(), train[0])["reward"].total
    assert max(driven.returns) <= empty + 1e-6
    demos = merge(demonstrate(env, teacher, train), driven)
    model = ActorCritic(len(env.features), ACTIONS.size, (64, 64))
    history = clone(model, demos, epochs=80, lr=3e-3, seed=0)
    assert history[-1]["bc_accuracy"] > 0.95
    learned = LearnedPolicy(model.eval(), env.features)
    found = [run_episode(env, learned, q)["answer_found"] for q in train]
    assert sum(found) / len(found) >= taught - 0.15


def test_the_command_line_names_what_is_missing_or_does_not_apply(
    tmp_path: Path, question_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from podium_app.cli import main

    assert main(["train", "--env", "context", "--questions", str(tmp_path)]) == 2
    assert "--env context needs --index DIR and --questions PATH" in capsys.readouterr().err
    args = ["train", "--env", "context", "--index", str(tmp_path), "--questions", str(tmp_path)]
    assert main([*args, "--pool", str(tmp_path / "pool.yaml")]) == 2
    assert "--pool does not apply to --env context" in capsys.readouterr().err
    assert main([*args, "--budget", "0"]) == 2
    assert "--budget must be >= 1" in capsys.readouterr().err
    assert main([*args, "--quick"]) == 2
    assert "--quick is not supported" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    run = ["--questions", str(question_file), "--run-dir", str(tmp_path / "run")]
    assert main([*args, *run, "--reward-config", str(missing)]) == 2
    assert f"--reward-config: reward config {missing}: cannot read" in capsys.readouterr().err
