"""What ``podium train`` trains on: the user's pool and task library (``--pool``, ``--tasks``),
generated suites over the pool's kinds otherwise, pool variants, the deterministic held-out
split, and one-line errors naming the flag for unusable input."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import yaml

from podium.envs.swarm import default_pool, load_tasks, parse_task
from podium.envs.swarm.generator import GENERALIST_ONLY_KINDS, generate_suite, held_out_split
from podium.envs.swarm.spec import default_pool_path, default_tasks_dir
from podium.errors import ConfigError
from podium_app.train.config import TrainConfig
from podium_app.train.suites import (
    GENERATED,
    describe,
    generator_kinds,
    load_train_pool,
    split_library,
    task_suites,
    training_pools,
)

SMALL_POOL = {
    "name": "mine",
    "max_parallel": 2,
    "agents": [
        {"name": "writer", "kinds": {"copy": {"speed": 1.0, "success": 0.9, "noise": 0.2}}},
        {
            "name": "coder",
            "kinds": {"code": {"speed": 1.2, "success": 0.9}},
            "true": {"code": {"speed": 0.6}},
        },
    ],
}


def _write(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _task(name: str, kinds: tuple[str, ...] = ("copy", "code")) -> dict[str, object]:
    return {
        "name": name,
        "subtasks": [
            {"id": f"s{i}", "kind": k, "work": 1.0 + i, "deps": [f"s{i - 1}"] if i else []}
            for i, k in enumerate(kinds)
        ],
    }


def test_without_tasks_the_default_run_generates_the_suites_it_always_did() -> None:
    """Same suites as before ``--pool``/``--tasks`` existed: the default pool's kinds in the
    generator's order, the generalist-only kinds mixed in, another seed for the test suite."""
    cfg = TrainConfig(suite_size=30, test_suite_size=5, sizes=(4, 10), test_sizes=(4, 10))
    suites = task_suites(cfg, default_pool())
    suite = generate_suite(
        30, seed=1, sizes=(4, 10), extra_kinds=GENERALIST_ONLY_KINDS, extra_kind_p=0.05
    )
    assert (suites.train, suites.validation) == tuple(held_out_split(suite, 0.15, salt="val"))
    assert suites.test == generate_suite(5, seed=10_007, sizes=(4, 10))
    assert suites.source == GENERATED


def test_generated_suites_follow_a_users_pool_kinds(tmp_path: Path) -> None:
    pool = load_train_pool(_write(tmp_path / "pool.yaml", SMALL_POOL))
    kinds, extra = generator_kinds(pool.advertised)
    assert kinds == ("code", "copy") and extra == ()  # no generalist: no uncovered kinds
    cfg = TrainConfig(suite_size=10, test_suite_size=3, sizes=(3, 6), test_sizes=(3, 6))
    suites = task_suites(cfg, pool.advertised)
    used = {s.kind for t in [*suites.train, *suites.validation, *suites.test] for s in t.subtasks}
    assert used <= {"code", "copy"}


def test_the_pool_file_is_the_advertisement_and_its_truth_reaches_only_the_simulator(
    tmp_path: Path,
) -> None:
    pool = load_train_pool(_write(tmp_path / "pool.yaml", SMALL_POOL))
    assert pool.source == str(tmp_path / "pool.yaml")
    assert pool.advertised.truth is None
    assert pool.advertised.agents[1].kinds["code"].speed == 1.2
    assert pool.truth is not None and pool.truth.agents[1].kinds["code"].speed == 0.6
    default = load_train_pool(None)
    assert default.truth is None and default.source == str(default_pool_path())


def test_a_library_holds_out_a_deterministic_part_named_by_hash(tmp_path: Path) -> None:
    for i in range(12):
        _write(tmp_path / "tasks" / f"t{i:02d}.yaml", _task(f"task-{i}"))
    pool = load_train_pool(_write(tmp_path / "pool.yaml", SMALL_POOL))
    cfg = TrainConfig(tasks=tmp_path / "tasks")
    suites = task_suites(cfg, pool.advertised)
    names = lambda ts: [t.name for t in ts]  # noqa: E731
    assert len(suites.test) == 3  # ceil(0.2 × 12)
    assert len(suites.validation) == 2  # ceil(0.15 × 9)
    assert len(suites.train) == 7
    every = names(suites.train) + names(suites.validation) + names(suites.test)
    assert sorted(every) == sorted(f"task-{i}" for i in range(12))  # disjoint, complete
    in_files = names(load_tasks(tmp_path / "tasks"))
    for part in (suites.train, suites.validation, suites.test):  # each in file order
        assert names(part) == [n for n in in_files if n in names(part)]
    assert suites.source == str(tmp_path / "tasks") and "never trained on" in suites.held_out
    # The lowest name hashes, so independent of file order.
    by_hash = sorted(in_files, key=lambda n: hashlib.sha256(f"test:{n}".encode()).digest())
    assert set(names(suites.test)) == set(by_hash[:3])
    again = split_library(list(reversed(suites.train + suites.validation + suites.test)), cfg)
    assert [set(names(p)) for p in again[:3]] == [
        set(names(p)) for p in (suites.train, suites.validation, suites.test)
    ]


def test_a_tiny_share_still_holds_one_task_out_for_each_split(tmp_path: Path) -> None:
    tasks = [parse_task(_task(f"x{i}")) for i in range(10)]
    cfg = TrainConfig(test_fraction=0.001, validation_fraction=0.001)
    train, validation, test, _ = split_library(tasks, cfg)
    assert len(test) == len(validation) == 1 and len(train) == 8
    assert test != validation


def test_a_small_library_is_not_held_out_and_the_report_says_so(tmp_path: Path) -> None:
    for i in range(4):
        _write(tmp_path / "tasks" / f"t{i}.yaml", _task(f"small-{i}"))
    pool = load_train_pool(_write(tmp_path / "pool.yaml", SMALL_POOL))
    suites = task_suites(TrainConfig(tasks=tmp_path / "tasks"), pool.advertised)
    assert suites.train == suites.validation == suites.test and len(suites.test) == 4
    assert suites.held_out.startswith("none: fewer than 10 tasks")
    described = describe(training_pools(TrainConfig(pool=tmp_path / "pool.yaml")), suites)
    assert described["pool"] == {
        "name": "mine",
        "source": str(tmp_path / "pool.yaml"),
        "agents": ["writer", "coder"],
        "kinds": ["code", "copy"],
        "true_profiles": True,
        "deviations": {"writer": "honest", "coder": "slower"},
    }
    assert described["variants"] == []
    assert described["tasks"]["count"] == 4
    assert described["tasks"]["source"] == str(tmp_path / "tasks")


def test_pool_variants_join_the_base_pool(tmp_path: Path) -> None:
    pools = training_pools(TrainConfig(pool_variants=3, seed=5))
    assert [p.spec.name for p in pools] == ["default", "default-v1", "default-v2", "default-v3"]
    assert pools[1].source == "variant 1 of default"
    assert all(p.truth is not None for p in pools[1:])
    assert pools == training_pools(TrainConfig(pool_variants=3, seed=5))
    with pytest.raises(ConfigError, match="pool_variants"):
        TrainConfig(pool_variants=-1)


def _parse(*argv: str) -> argparse.Namespace:
    from podium_app.commands.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_pool_tasks_and_variants_reach_the_config(tmp_path: Path) -> None:
    from podium_app.commands.train import config_from_args

    cfg = config_from_args(
        _parse("--pool", "p.yaml", "--tasks", "lib", "--pool-variants", "3", "--quick")
    )
    assert isinstance(cfg, TrainConfig)
    assert (cfg.pool, cfg.tasks, cfg.pool_variants) == (Path("p.yaml"), Path("lib"), 3)
    assert cfg.to_json()["pool"] == "p.yaml" and cfg.to_json()["tasks"] == "lib"
    plain = config_from_args(_parse())
    assert isinstance(plain, TrainConfig)
    assert (plain.pool, plain.tasks, plain.pool_variants) == (None, None, 0)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--pool", "{d}/absent.yaml"], "podium train: --pool: {d}/absent.yaml: no such file"),
        (["--pool", "{d}/bad.yaml"], "podium train: --pool: {d}/bad.yaml: agent 'a'"),
        (["--tasks", "{d}/nothing"], "podium train: --tasks: {d}/nothing: no such file"),
        (["--tasks", "{d}/empty"], "podium train: --tasks: {d}/empty: no task files"),
        (
            ["--pool", "{d}/pool.yaml", "--tasks", str(default_tasks_dir())],
            "podium train: --tasks: ",
        ),
        (["--tasks", "{d}/lib", "--suite-size", "9"], "podium train: --suite-size sizes the"),
    ],
)
def test_unusable_input_exits_2_with_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    """Checked before anything else: the previous run in the run directory stays put."""
    from podium_app.cli import main

    _write(tmp_path / "bad.yaml", {"agents": [{"name": "a", "kinds": {"x": {"speed": 0}}}]})
    _write(tmp_path / "pool.yaml", SMALL_POOL)
    _write(tmp_path / "lib" / "one.yaml", _task("one"))
    (tmp_path / "empty").mkdir()
    run_dir = tmp_path / "run"
    (run_dir / "keep").mkdir(parents=True)
    args = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["train", "--run-dir", str(run_dir), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected.replace("{d}", str(tmp_path))), err
    assert len(err.splitlines()) == 1
    assert (run_dir / "keep").is_dir() and [p.name for p in tmp_path.iterdir()].count("run") == 1
    if "--pool" in argv and "--tasks" in argv:
        # The shipped library's kinds are not the small pool's: the file and subtask named.
        assert "no agent in pool 'mine' can do kind" in err and ".yaml" in err
