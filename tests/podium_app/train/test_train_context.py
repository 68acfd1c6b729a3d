"""``podium train --env context``: cloning, PPO through reward_svc and the learning loop on a
real index (bm25s + embedded Chroma) of trimmed real docs, and the learned agent it leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from podium import rewards
from podium.context.env import ContextEnv, ContextEnvConfig
from podium.context.generate import all_questions, generate
from podium.context.heuristics import SelectivePolicy, run_episode
from podium.context.index import ContextIndex
from podium.context.learned import load_learned_policy
from podium.context.questions import write_questions
from podium.errors import ConfigError
from podium.rewards.context import episode_trajectory
from podium_app.train.context import ContextTrainConfig, load_splits, reward_config, split_of
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
    phases: list[str] = []
    result = await train_context(cfg, lambda phase, _f: phases.append(phase))
    assert {"bc", "ppo", "eval"} <= set(phases)
    # Cloning learns the teacher's decisions, and the clone (version 0) finds answers on
    # validation about as often as the teacher does.
    assert result.bc_history[-1]["bc_accuracy"] > 0.9
    teacher_val = result.validation[result.teacher]["answer_found"]
    assert result.history[0]["val_answer_found"] >= teacher_val - 0.2
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
