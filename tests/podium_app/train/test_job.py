"""``podium train`` on the embedded default: the job runs reward_svc and learner_svc's learning
loop as tasks on the in-process bus; every trajectory is trained exactly once, carries its
rollout baseline, and every published version >= 1 is exported to ONNX beside its weights
(``--model-repository``) and computes what they compute."""

from __future__ import annotations

import argparse
import stat
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from learner_svc.checkpoint import load_checkpoint
from podium.bus import EventPublisher
from podium.policy.artifacts import load_weights
from podium.policy.signing import SigningKey, TrustedKeys
from podium.policy.swarm import MODEL_NAME, build_swarm_policy, serving_signature
from podium.serving.contract import random_inputs
from podium.serving.export import onnx_session, torch_forward
from podium.v1 import trajectory_pb2
from podium_app.train import job
from podium_app.train.config import TrainConfig
from podium_app.train.job import train
from podium_app.train.services import ProcessServices, run_key_pair


def small_config(run_dir: Path, **kw: object) -> TrainConfig:
    """A job of a few seconds: a dozen small tasks, two PPO iterations."""
    settings: dict[str, object] = {
        "run_dir": run_dir,
        "suite_size": 12,
        "sizes": (4, 8),
        "curriculum": (8,),
        "test_suite_size": 2,
        "test_sizes": (4, 8),
        "bc_demos_per_task": 1,
        "bc_epochs": 1,
        "iterations": 2,
        "episodes_per_iteration": 4,
        "num_envs": 4,
        "eval_every": 1,
        "validation_seeds": 1,
        "test_episodes": 1,
    }
    settings.update(kw)
    return TrainConfig(**settings)  # type: ignore[arg-type]


async def test_embedded_job_trains_every_trajectory_once_and_exports_each_version(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "models"
    config = small_config(tmp_path / "run", model_repository=repository)
    result = await train(config)
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    # The learner is learner_svc's loop: its checkpoint's ledger holds every session once.
    ckpt = load_checkpoint(tmp_path / "run" / "learner")
    assert ckpt is not None
    state = ckpt.state
    assert state.step == config.iterations and state.policy_version == config.iterations
    assert state.trained == len(set(state.ledger)) == config.iterations * 4
    assert state.skipped_off_policy == state.dropped_stale == state.dead_lettered == 0
    # Each update saw the rollout baseline (cpls on the same sessions) and the critic warm-up.
    assert [h.stats.get("critic_only") for h in result.history[1:]] == [1.0, 0.0]
    assert all("gain_vs_baseline" in h.stats for h in result.history[1:])
    weights_root = tmp_path / "run" / "checkpoints" / MODEL_NAME
    published = sorted(int(d.name) for d in weights_root.iterdir() if d.name.isdigit())
    exported = sorted(int(d.name) for d in (repository / MODEL_NAME).iterdir() if d.is_dir())
    # 0 = behaviour cloning (never exported: Triton versions start at 1), then one per update.
    assert published == [0, 1, 2] and exported == [1, 2]
    for version in exported:
        net, _ = build_swarm_policy(
            load_weights(weights_root / str(version) / "weights.safetensors")
        )
        inputs = random_inputs(serving_signature(net), 3, 6, np.random.default_rng(version))
        got = onnx_session(repository / MODEL_NAME / str(version) / "model.onnx").run(
            None, inputs.arrays()
        )
        for g, w in zip(got, torch_forward(net, inputs), strict=True):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    summary = result.summary["summary"]
    assert set(summary) == {"sequential", "greedy", "cpls", "learned"}
    assert (tmp_path / "run" / "report.html").is_file()
    # The actor served only what the run's own key signed (it refuses anything else).
    assert (tmp_path / "run" / "keys" / "policy-signing.pub").is_file()


@pytest.mark.parametrize("lag", [0, 1])
async def test_the_actor_samples_ahead_by_at_most_the_policy_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lag: int
) -> None:
    """``max_policy_lag`` 1 (the default): iterations that do not validate sample the next
    iteration's sessions while the learner updates, so those sessions are acted by the
    version before the newest, never older; the learner trains every one of them. 0: each
    iteration's sessions are acted by the newest version."""
    acted: list[set[str]] = []
    publish = job.publish_trajectories

    async def recording(
        publisher: EventPublisher, topic: str, trajs: list[trajectory_pb2.Trajectory]
    ) -> None:
        acted.append({t.policy_version for t in trajs})
        await publish(publisher, topic, trajs)

    monkeypatch.setattr(job, "publish_trajectories", recording)
    config = small_config(tmp_path / "run", iterations=4, eval_every=4, max_policy_lag=lag)
    result = await train(config)
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    assert len(acted) == 4 and all(len(versions) == 1 for versions in acted)
    versions = [int(next(iter(v))) for v in acted]
    newest = [it - 1 for it in range(1, 5)]  # iteration it follows version it - 1
    if lag == 0:
        assert versions == newest
    else:
        assert all(n - 1 <= v <= n for v, n in zip(versions, newest, strict=True))
    ckpt = load_checkpoint(tmp_path / "run" / "learner")
    assert ckpt is not None
    assert ckpt.state.trained == 4 * 4
    assert ckpt.state.skipped_off_policy == ckpt.state.dropped_stale == 0


def test_a_run_makes_its_own_key_pair_learner_private_actor_public(tmp_path: Path) -> None:
    """Zero setup: the run's pair is made in its directory; the learner process gets the
    private key through the setting an operator would set."""
    config = small_config(tmp_path / "run", bus="kafka://127.0.0.1:9")
    envs = ProcessServices(config, "t").environments(tmp_path / "init.safetensors", 8)
    pair = run_key_pair(config)
    assert envs["learner_svc"]["PODIUM_POLICY_SIGNING_KEY"] == str(pair.private_path)
    assert "PODIUM_POLICY_SIGNING_KEY" not in envs["reward_svc"]
    assert pair.private_path.parent == (tmp_path / "run" / "keys").resolve()
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    signer = SigningKey.load(pair.private_path)
    assert signer.key_id in TrustedKeys.load(str(pair.public_path)).keys
    assert run_key_pair(config) == pair  # a rerun in the same directory keeps its key


def test_cli_options_reach_the_config(tmp_path: Path) -> None:
    from podium_app.commands.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--quick", "--model-repository", str(tmp_path), "--bus", "kafka://127.0.0.1:9"]
    )
    cfg = config_from_args(args)
    assert isinstance(cfg, TrainConfig) and cfg.model_repository == tmp_path
    assert cfg.bus == "kafka://127.0.0.1:9"
    assert config_from_args(parser.parse_args([])).model_repository is None  # type: ignore[attr-defined]


def test_train_command_sets_a_previous_run_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Re-running the README's main job into the same run directory works and keeps the
    earlier run (versions are immutable: writing into its checkpoints would be refused)."""
    from podium_app.cli import main
    from podium_app.commands.train import set_aside_previous_run

    assert set_aside_previous_run(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert set_aside_previous_run(tmp_path / "empty") is None
    run_dir = tmp_path / "latest"
    (run_dir / "checkpoints" / "swarm_policy" / "1").mkdir(parents=True)
    (run_dir / "checkpoints" / "swarm_policy" / "1" / "weights.safetensors").write_bytes(b"old")
    assert main(["train", "--quick", "--run-dir", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert f"previous run in {run_dir} moved to" in err
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("latest.")]
    assert len(kept) == 1
    assert (kept[0] / "checkpoints/swarm_policy/1/weights.safetensors").read_bytes() == b"old"
    assert (run_dir / "report.html").is_file() and (run_dir / "summary.json").is_file()
    # A second set-aside in the same second does not collide with the first.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("1")
    first = set_aside_previous_run(tmp_path / "other")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("2")
    second = set_aside_previous_run(tmp_path / "other")
    assert first is not None and second is not None and first != second
    assert (second / "x").read_text() == "2"


def test_every_ppo_setting_reaches_the_learner(tmp_path: Path) -> None:
    """TrainConfig.ppo reaches the learner through its settings, every field (each changed
    here to a value of its own), in-process and as the learner process's environment; the
    cloning settings are the driver's (behaviour cloning runs there). One that could not
    reach it would be an error naming it, not a silently different run."""
    import dataclasses
    from dataclasses import replace

    from learner_svc.algorithms.swarm import CLONING_FIELDS, SwarmSettings
    from podium.config import from_env
    from podium_app.train.services import RunTopics, learner_settings, settings_env

    config = small_config(tmp_path / "run")
    loop, settings = learner_settings(config, tmp_path / "init.safetensors", 16, RunTopics())
    assert settings.ppo().learning_rate == config.ppo.learning_rate
    assert loop.batch_trajectories == config.episodes_per_iteration
    odd_values = {
        f.name: (getattr(config.ppo, f.name) * 0.5 if f.type == "float" else 3)
        for f in dataclasses.fields(config.ppo)
    }
    odd = replace(config, ppo=replace(config.ppo, **odd_values), torch_threads=2)
    _, settings = learner_settings(odd, tmp_path / "init.safetensors", 16, RunTopics())
    got = settings.ppo()
    driver_only = set(CLONING_FIELDS)
    for name, value in odd_values.items():
        if name not in driver_only:
            assert getattr(got, name) == value != getattr(config.ppo, name), name
    assert settings.torch_threads == 2 and settings.device == "cpu"
    # The learner process reads the same values back from its environment.
    env = settings_env(settings)
    assert env["PODIUM_LEARNER_CLIP_COEF"] == repr(odd.ppo.clip_coef)
    assert from_env(SwarmSettings, env).ppo() == got


async def test_a_users_pool_and_tasks_with_pool_variants_train_through_the_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--pool FILE --tasks DIR --pool-variants 2``: the sessions run on the user's pool
    (its true profiles hidden from the planners) and on two variants of it (other agent
    names and counts), the learner trains on all of them, and the report and summary name
    the pool and the tasks."""
    import json

    import yaml

    from podium.envs.swarm.spec import default_tasks_dir
    from podium_app.train import job

    pool = tmp_path / "my-pool.yaml"
    spec = yaml.safe_load((Path(default_tasks_dir()).parent / "pools" / "default.yaml").read_text())
    spec["name"] = "my-pool"
    spec["agents"][1]["true"] = {"api": {"speed": 0.5}}  # backend: slower than it says
    pool.write_text(yaml.safe_dump(spec))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("chain-8.yaml", "diamond-10.yaml", "layered-5.yaml", "login-system.yaml"):
        (tasks / name).write_bytes((Path(default_tasks_dir()) / name).read_bytes())
    seen: list[tuple[str, ...]] = []
    publish = job.publish_trajectories

    async def recording(publisher: object, topic: str, trajs: list) -> None:  # type: ignore[type-arg]
        seen.extend(tuple(t.agents) for t in trajs)
        await publish(publisher, topic, trajs)  # type: ignore[arg-type]

    monkeypatch.setattr(job, "publish_trajectories", recording)
    config = small_config(
        tmp_path / "run", pool=pool, tasks=tasks, pool_variants=2, episodes_per_iteration=8
    )
    result = await train(config)
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    ckpt = load_checkpoint(tmp_path / "run" / "learner")
    assert ckpt is not None and ckpt.state.trained == config.iterations * 8
    assert ckpt.state.dead_lettered == 0
    pools = {agents[0].split("-agent-")[0] if "-agent-" in agents[0] else "base" for agents in seen}
    assert pools == {"base", "v1", "v2"}, seen  # every pool met (fixed seed), each its agents
    training = json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["training"]
    assert training["pool"]["name"] == "my-pool" and training["pool"]["source"] == str(pool)
    assert training["pool"]["true_profiles"] is True
    assert [v["name"] for v in training["variants"]] == ["my-pool-v1", "my-pool-v2"]
    # Each session's trajectory names the agents of the pool it ran on, in action order.
    layouts = {tuple(p["agents"]) for p in [training["pool"], *training["variants"]]}
    assert set(seen) == layouts and len(layouts) == 3
    assert training["tasks"]["source"] == str(tasks) and training["tasks"]["count"] == 4
    assert training["tasks"]["held_out"].startswith("none: fewer than 10 tasks")
    assert sorted(training["tasks"]["test"]) == [
        "chain-8",
        "diamond-10",
        "layered-5",
        "login-system",
    ]
    # The table ran on the user's pool's truth, with cpls on online estimates beside cpls.
    assert set(result.summary["summary"]) == {
        "sequential",
        "greedy",
        "cpls",
        "cpls-online",
        "learned",
    }
    report = (tmp_path / "run" / "report.html").read_text()
    assert "my-pool" in report and str(pool) in report and str(tasks) in report
    assert "login-system" in report and "my-pool-v2" in report
    assert training["pool"]["deviations"]["backend"] == "slower"
    assert "the simulator draws from them (1 slower, 8 honest)" in report


async def test_init_fine_tunes_a_trained_policy_on_another_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--init RUN``: no behaviour cloning; the given policy is the learner's version 0 (the
    same weights), the run trains on its own pool (here the unseen one, other agents), and
    its sessions carry the advice's rule engine as their rollout baseline."""
    from podium.envs.swarm import EnvConfig
    from podium.envs.swarm.spec import default_tasks_dir
    from podium_app.train import job
    from podium_app.train.config import teacher_rule

    first = await train(small_config(tmp_path / "base", iterations=1))
    baselines: set[str] = set()
    publish = job.publish_trajectories

    async def recording(publisher: object, topic: str, trajs: list) -> None:  # type: ignore[type-arg]
        baselines.update(t.baseline.policy for t in trajs)
        await publish(publisher, topic, trajs)  # type: ignore[arg-type]

    monkeypatch.setattr(job, "publish_trajectories", recording)
    unseen = Path(default_tasks_dir()).parent / "pools" / "unseen.yaml"
    config = small_config(tmp_path / "ft", pool=unseen, init=tmp_path / "base")
    result = await train(config)
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    assert result.bc_history == []  # nothing cloned
    given = load_weights(first.best_checkpoint).tensors
    init = load_weights(tmp_path / "ft" / "init" / MODEL_NAME / "0" / "weights.safetensors")
    assert init.metadata["init"] == "policy" and init.metadata["source"] == str(tmp_path / "base")
    v0 = load_weights(tmp_path / "ft" / "checkpoints" / MODEL_NAME / "0" / "weights.safetensors")
    assert set(given) == set(v0.tensors)
    for name, tensor in given.items():
        assert np.array_equal(tensor.numpy(), v0.tensors[name].numpy()), name
    ckpt = load_checkpoint(tmp_path / "ft" / "learner")
    assert ckpt is not None and ckpt.state.trained == config.iterations * 4
    assert result.summary["config"]["pool"] == "unseen"
    assert baselines == {teacher_rule(EnvConfig().advice)}


def test_an_unusable_init_exits_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from podium_app.cli import main

    assert (
        main(["train", "--quick", "--run-dir", str(tmp_path / "r"), "--init", str(tmp_path)]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("podium train: --init: ") and "no policy checkpoint" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("feed", ["sessions", "warmup"])
def test_training_stores_start_warm_and_feed_as_configured(tmp_path: Path, feed: str) -> None:
    """Each pool's store is warmed by cpls sessions on its truth before training (the bench's
    warm-up); the training sessions feed it with ``stats_feed="sessions"`` and leave it as
    the warm-up made it with ``"warmup"``."""
    from podium.envs.swarm import EnvConfig
    from podium.policy.rollout import Job, run_episodes
    from podium_app.train.job import training_envs
    from podium_app.train.suites import task_suites, training_pools

    config = small_config(tmp_path / "run", pool_variants=1, stats_feed=feed)
    pools = training_pools(config)
    tasks = task_suites(config, pools[0].advertised)
    env_cfg = EnvConfig(max_subtasks=tasks.max_size, invalid_action="raise")
    per_pool = training_envs(config, tasks, pools, env_cfg)
    assert len(per_pool) == 2 and all(len(envs) == config.num_envs for envs in per_pool)
    stores = [envs[0].stats for envs in per_pool]
    assert stores[0] is not stores[1]  # a store per pool, shared by its environments
    assert all(
        env.stats is store for envs, store in zip(per_pool, stores, strict=True) for env in envs
    )
    warmed = [s.version for s in stores if s is not None]
    assert len(warmed) == 2 and all(v > 0 for v in warmed)  # cpls sessions recorded
    run_episodes(per_pool[0], [Job(t, 1) for t in tasks.train[:3]], rule="cpls")
    assert stores[0] is not None
    assert (stores[0].version > warmed[0]) == (feed == "sessions")
    cold = training_envs(replace(config, store_warmup=0), tasks, pools[:1], env_cfg)
    assert cold[0][0].stats is not None and cold[0][0].stats.version == 0


async def test_cloning_counts_its_sessions_for_the_progress_display(tmp_path: Path) -> None:
    """A planner teacher costs seconds a session, so collecting its demonstrations and each
    DAgger round's labels reports sessions done out of the total (phase ``collect``): from 0,
    never backwards, ending at the total (training tasks x demonstrations per task; one
    session per training task in a DAgger round)."""
    reports: list[tuple[str, dict[str, float]]] = []
    config = small_config(
        tmp_path / "run",
        teacher="planner-online",
        bc_demos_per_task=2,
        dagger_rounds=1,
        iterations=1,
    )
    result = await train(config, lambda phase, figures: reports.append((phase, dict(figures))))
    assert result.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    collect = [f for phase, f in reports if phase == "collect"]
    train_tasks = len(result.summary["config"]["training"]["tasks"]["train"])
    assert train_tasks > 0
    for rnd, total in ((0, 2 * train_tasks), (1, train_tasks)):
        done = [f["done"] for f in collect if f["round"] == rnd]
        assert {f["total"] for f in collect if f["round"] == rnd} == {total}
        assert done[0] == 0 and done[-1] == total and done == sorted(done), (rnd, done)
    # Demonstrations first, then the DAgger round, both before the first PPO iteration.
    phases = [phase for phase, _ in reports]
    assert phases.index("collect") < phases.index("ppo")
    assert [f["round"] for f in collect] == sorted(f["round"] for f in collect)
    # `podium train` shows them on its bar.
    from podium_app.commands.train import bar_update

    shown = bar_update("collect", collect[-1], config, "behaviour cloning")
    assert shown == {"completed": train_tasks, "total": train_tasks, "figures": "DAgger 1 labels"}
