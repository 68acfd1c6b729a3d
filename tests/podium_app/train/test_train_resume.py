"""``podium train --resume RUN_DIR`` continues a run from its checkpoints (the learner's
weights, optimizer and update counter; the driver's random streams, stores, curves and
TensorBoard step), ``config.yaml`` reproduces a run, and the hyperparameters with the
held-out figures are in the run's TensorBoard log."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from learner_svc.checkpoint import load_checkpoint
from podium.errors import ConfigError
from podium.policy.swarm import MODEL_NAME
from podium_app.train import job
from podium_app.train.config import TrainConfig, config_yaml
from podium_app.train.job import train


def tiny(run_dir: Path, **kw: object) -> TrainConfig:
    """A run of a few seconds (as tests/podium_app/train/test_job.py's small_config)."""
    settings: dict[str, object] = {
        "run_dir": run_dir,
        "suite_size": 12,
        "sizes": (4, 8),
        "curriculum": (8,),
        "test_suite_size": 2,
        "test_sizes": (4, 8),
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


def weights_sha(run_dir: Path, version: int) -> str:
    path = run_dir / "checkpoints" / MODEL_NAME / str(version) / "weights.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Crash(Exception):
    """Stands for the process dying after an iteration's checkpoints."""


def crash_after_first(checkpoint: Callable[..., None]) -> Callable[..., None]:
    """``job._checkpoint`` that raises :class:`Crash` once iteration 1's checkpoint is written."""

    def checkpoint_then_crash(run: job._Run, iteration: int, *args: object) -> None:
        checkpoint(run, iteration, *args)
        if iteration == 1:
            raise Crash

    return checkpoint_then_crash


def scalar_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps ``tag`` was written at, over every event file of the run, sorted: the files
    are read in name order, and two writers of one process opened within the same second are
    named by a counter compared as text (``….9`` after ``….10``)."""
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return sorted(e.step for e in acc.Scalars(tag))


async def test_resume_continues_the_run_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped after its first iteration and resumed ends exactly where the same run
    uninterrupted ends: the update counter goes on from the checkpoint (1 → 2), version 2's
    weights are bit for bit the uninterrupted run's (weights, Adam moments, generators and
    statistics stores all continued), and the TensorBoard curves have each step once."""
    whole = await train(tiny(tmp_path / "whole"))
    checkpoint = job._checkpoint
    monkeypatch.setattr(job, "_checkpoint", crash_after_first(checkpoint))
    config = tiny(tmp_path / "cut")
    with pytest.raises(Crash):
        await train(config)
    cut = load_checkpoint(config.run_dir / "learner")
    assert cut is not None and (cut.state.step, cut.state.policy_version) == (1, 1)
    version_1 = weights_sha(config.run_dir, 1)
    monkeypatch.setattr(job, "_checkpoint", checkpoint)

    resumed = await train(config, resume_run=True)
    assert resumed.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    ckpt = load_checkpoint(config.run_dir / "learner")
    assert ckpt is not None
    assert (ckpt.state.step, ckpt.state.policy_version) == (2, 2)
    assert ckpt.state.trained == len(set(ckpt.state.ledger)) == 2 * 4
    assert weights_sha(config.run_dir, 1) == version_1  # version 1 is the cut run's
    assert weights_sha(config.run_dir, 2) == weights_sha(tmp_path / "whole", 2)
    assert [h.iteration for h in resumed.history] == [0, 1, 2]
    assert [h.train_ratio for h in resumed.history[1:]] == [
        h.train_ratio for h in whole.history[1:]
    ]
    assert resumed.bc_history == whole.bc_history
    assert resumed.summary["summary"] == whole.summary["summary"]
    # The driver's and the learner's curves go on from the checkpoint's step.
    assert scalar_steps(config.run_dir, "train/ratio_to_bound") == [1, 2]
    assert scalar_steps(config.run_dir, "learner/policy_version") == [1, 2]


async def test_a_run_sampling_ahead_resumes_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut after iteration 1 while iteration 2's sessions were sampling ahead (validation
    only at the end), the run resumes from the streams captured before those sessions were
    drawn: the learner goes on from version 1 and trains every session of the 3 iterations
    once."""
    checkpoint = job._checkpoint
    monkeypatch.setattr(job, "_checkpoint", crash_after_first(checkpoint))
    config = tiny(tmp_path / "cut", iterations=3, eval_every=3)
    with pytest.raises(Crash):
        await train(config)
    monkeypatch.setattr(job, "_checkpoint", checkpoint)
    resumed = await train(config, resume_run=True)
    assert resumed.exit_codes == {"reward_svc": 0, "learner_svc": 0}
    ckpt = load_checkpoint(config.run_dir / "learner")
    assert ckpt is not None
    assert (ckpt.state.step, ckpt.state.policy_version) == (3, 3)
    assert ckpt.state.trained == len(set(ckpt.state.ledger)) == 3 * 4
    assert [h.iteration for h in resumed.history] == [0, 1, 2, 3]


async def test_the_run_logs_its_hyperparameters_and_config(tmp_path: Path) -> None:
    """TensorBoard's hparams hold every setting and the held-out figures (read back from the
    event file), and ``config.yaml`` is the resolved config."""
    config = tiny(tmp_path / "run", iterations=1, seed=5)
    result = await train(config)
    acc = EventAccumulator(str(config.run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    hparams = dict(start.hparams)
    assert hparams["seed"].number_value == 5
    assert hparams["ppo.clip_coef"].number_value == pytest.approx(config.ppo.clip_coef)
    assert hparams["env.advice"].string_value == config.env.advice
    assert hparams["network.d_model"].number_value == 64
    assert hparams["pool"].string_value == "none"
    assert hparams["sizes"].string_value == "4,8"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    assert "hparam/heldout_ratio_to_bound" in {m.name.tag for m in experiment.metric_infos}
    (heldout,) = acc.Scalars("hparam/heldout_ratio_to_bound")
    learned = result.summary["summary"]["learned"]["ratio_to_bound_mean"]
    assert heldout.value == pytest.approx(learned, rel=1e-6)
    assert (config.run_dir / "config.yaml").read_text() == config_yaml(config)


def test_resume_refuses_what_is_not_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from podium_app.cli import main

    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no such file" in capsys.readouterr().err
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.yaml").write_text(config_yaml(tiny(started)))
    with pytest.raises(ConfigError, match=r"no driver\.json"):
        job._resumed(tiny(started))
    assert main(["train", "--resume", str(started), "--run-dir", str(tmp_path / "x")]) == 2
    assert "a resumed run stays in its directory" in capsys.readouterr().err
