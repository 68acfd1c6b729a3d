"""``podium train``'s settings as flags and config files (:mod:`podium_app.settings_cli`):
every field of every config dataclass is a flag or refused with a reason, precedence is
defaults < ``--quick`` < ``--config`` < flags, unknown keys are named with the nearest valid
ones, and a run's ``config.yaml`` gives its config back."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from podium.errors import ConfigError
from podium_app.commands.train import add_arguments, config_from_args
from podium_app.settings_cli import apply, coerce, load_file, plain
from podium_app.train.config import DERIVED, TrainConfig, config_yaml, train_settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podium train")
    add_arguments(p)
    return p


def resolve(argv: list[str]) -> TrainConfig:
    cfg = config_from_args(parser().parse_args(argv))
    assert isinstance(cfg, TrainConfig)
    return cfg


def leaf_paths(obj: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every leaf field under a config dataclass instance, found independently of the code
    under test: a field whose value is a dataclass is walked into."""
    out: set[tuple[str, ...]] = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out |= leaf_paths(value, (*prefix, f.name))
        else:
            out.add((*prefix, f.name))
    return out


def test_every_field_of_every_config_dataclass_is_a_flag_or_refused_with_a_reason() -> None:
    """Adding a field to TrainConfig, SwarmPPOConfig, EnvConfig or NetworkConfig (or a new
    section) without a flag fails here: each leaf is generated as a flag, or is listed in
    DERIVED with the reason a run cannot set it."""
    settings = train_settings()
    generated = {s.path for s in settings}
    derived = {tuple(key.split(".")) for key in DERIVED}
    every = leaf_paths(TrainConfig())
    assert {p[0] for p in every if len(p) > 1} == {"ppo", "env", "network"}
    assert generated | derived == every, (every - generated - derived, derived - every)
    assert not generated & derived
    assert all(why for why in DERIVED.values())
    flags = parser()._option_string_actions
    for s in settings:
        # A flag, a help line from the field's docstring, and a type every value of which the
        # flag parses back (here: the default's text gives the default).
        assert s.flag in flags, s.key
        assert s.doc, f"{s.key} has no docstring"
        assert s.doc.split()[0] in (flags[s.flag].help or ""), s.key
        value = plain(s.default)
        text = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        if value is None:
            text = "none"
        if s.annotation is bool:
            argv = [s.flag if value else f"--no-{s.flag[2:]}"]
        else:
            argv = [s.flag, *text.split(" ")] if isinstance(value, list) else [s.flag, text]
        got = resolve(argv)
        for name in s.path:
            got = getattr(got, name)
        assert got == s.default, (s.key, argv)


def test_flags_override_the_config_file_which_overrides_quick_and_the_defaults(
    tmp_path: Path,
) -> None:
    config = tmp_path / "exp.yaml"
    config.write_text(
        "iterations: 7\nsizes: [4, 9]\nppo:\n  clip_coef: 0.1\n  update_epochs: 2\n"
        "env:\n  advice: advertised\nnetwork:\n  d_model: 32\n"
    )
    cfg = resolve(["--config", str(config), "--ppo-clip-coef", "0.3", "--episodes", "5"])
    assert cfg.iterations == 7 and cfg.sizes == (4, 9)  # from the file
    assert cfg.ppo.clip_coef == 0.3  # the flag beats the file
    assert cfg.ppo.update_epochs == 2 and cfg.env.advice == "advertised"
    assert cfg.network.d_model == 32 and cfg.network.heads == 4
    assert cfg.episodes_per_iteration == 5  # an older flag name still works
    # Untouched settings keep TrainConfig's defaults (its own PPO defaults, not the class's).
    assert cfg.ppo.learning_rate == TrainConfig().ppo.learning_rate == 1e-4
    assert cfg.env.invalid_action == "raise"
    # --quick is a preset under the file: the file's iterations win, the rest is quick's.
    quick = resolve(["--quick", "--config", str(config)])
    assert quick.iterations == 7 and quick.suite_size == 60
    assert resolve(["--quick"]).iterations == 4
    assert resolve(["--quick", "--iterations", "9"]).iterations == 9


def test_toml_files_and_optional_settings(tmp_path: Path) -> None:
    config = tmp_path / "exp.toml"
    config.write_text(
        'rollout_baseline = "none"\ncurriculum = [8, 16]\n[ppo]\ntarget_kl = 0.05\n'
        "[env]\nallow_early_finish = true\n"
    )
    cfg = resolve(["--config", str(config)])
    assert cfg.rollout_baseline is None and cfg.curriculum == (8, 16)
    assert cfg.ppo.target_kl == 0.05 and cfg.env.allow_early_finish is True
    assert resolve(["--rollout-baseline", "cpls"]).rollout_baseline == "cpls"
    assert resolve(["--no-agent-stats"]).agent_stats is False


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("iteratons: 3\n", "unknown setting 'iteratons'; did you mean iterations"),
        ("ppo:\n  clip_cof: 0.1\n", "unknown setting 'ppo.clip_cof'; did you mean ppo.clip_coef"),
        ("clip_coef: 0.1\n", "unknown setting 'clip_coef'; did you mean ppo.clip_coef"),
        ("nework:\n  d_model: 8\n", "unknown setting 'nework'"),
        ("env:\n  max_subtasks: 8\n", "env.max_subtasks cannot be set: the run sets it from"),
        ("ppo: 3\n", "ppo is a section: expected a mapping"),
        ("iterations: many\n", "iterations: expected integer, got 'many'"),
        ("sizes: [4]\n", "sizes: expected 2 values, got 1"),
        ("env:\n  advice: psychic\n", "env.advice: expected one of 'advertised', 'online'"),
        ("ppo:\n  learning_rate: .nan\n", "ppo.learning_rate: expected number"),
        ("- 1\n", "expected a mapping of settings, got list"),
    ],
)
def test_a_bad_config_file_is_refused_naming_the_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve(["--config", str(config)])
    assert problem in str(err.value) and str(config) in str(err.value)


def test_values_the_config_refuses_are_errors_naming_the_setting(tmp_path: Path) -> None:
    for argv, problem in [
        (["--iterations", "-1"], "iterations must be >= 0, got -1"),
        (["--network-d-model", "30"], "network.d_model (30) must be divisible by network.heads"),
        (["--torch-threads", "0"], "torch_threads must be >= 1"),
        (["--device", "tpu"], "device must be cpu, cuda, cuda:N or auto, got 'tpu'"),
    ]:
        with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            resolve(argv)
    with pytest.raises(SystemExit):
        resolve(["--iterations", "two"])  # argparse's own error, exit 2
    with pytest.raises(ConfigError, match="no such file"):
        resolve(["--config", str(tmp_path / "absent.yaml")])
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"\.yaml, \.yml or \.toml"):
        resolve(["--config", str(tmp_path / "x.json")])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_an_unavailable_device_is_a_clear_error_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from podium_app.cli import main

    assert resolve(["--device", "auto"]).device == "auto"
    assert main(["train", "--device", "cuda:1", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "podium train: device 'cuda:1': no CUDA device is available on this machine" in err
    assert not (tmp_path / "r").exists()  # refused before anything happened


def test_the_written_config_gives_the_same_config_back(tmp_path: Path) -> None:
    """``config.yaml`` as a run writes it: every setting (None, tuples, paths, sections),
    no derived field; read back it is the same TrainConfig."""
    cfg = resolve(
        [
            "--quick",
            "--seed",
            "3",
            "--pool",
            "my pool.yaml",
            "--rollout-baseline",
            "none",
            "--ppo-clip-coef",
            "0.15",
            "--env-advice",
            "advertised",
            "--network-layers",
            "3",
            "--curriculum",
            "6",
            "12",
            "18",
        ]
    )
    written = tmp_path / "config.yaml"
    written.write_text(config_yaml(cfg))
    text = written.read_text()
    assert "max_subtasks" not in text and "slot_features" not in text
    back = apply(TrainConfig(), load_file(written, train_settings(), derived=DERIVED))
    assert back == cfg
    assert resolve(["--config", str(written)]) == cfg


def test_coerce_accepts_the_same_values_from_text_and_from_files() -> None:
    assert coerce("3", int, "k") == coerce(3, int, "k") == 3
    assert coerce("0.5", float, "k") == coerce(0.5, float, "k") == coerce(1, float, "k") * 0.5
    assert coerce("yes", bool, "k") is coerce(True, bool, "k") is True
    assert coerce("4,9", tuple[int, int], "k") == coerce([4, 9], tuple[int, int], "k")
    assert coerce("none", Path | None, "k") is None and coerce(None, Path | None, "k") is None
    for bad, tp in [(True, int), (2.5, int), ("x", float), (3, str), ("", Path), ("inf", float)]:
        with pytest.raises(ConfigError, match=r"^k: expected"):
            coerce(bad, tp, "k")


def test_suite_sizes_with_a_task_library_are_refused_naming_the_flag_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from podium.envs.swarm.spec import default_tasks_dir
    from podium_app.cli import main

    tasks = str(default_tasks_dir())
    argv = ["train", "--tasks", tasks, "--test-tasks", "3", "--run-dir", str(tmp_path / "r")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--test-suite-size / --test-tasks sizes the generated suites" in err
    # From a config file the same setting is no command-line choice: a run's config.yaml
    # holds every setting, so it is not refused there.
    config = tmp_path / "c.yaml"
    config.write_text(f"tasks: {tasks}\nsuite_size: 12\n")
    assert resolve(["--config", str(config)]).suite_size == 12
