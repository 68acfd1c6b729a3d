"""``podium bench scheduling --policies ...,learned --checkpoint PATH`` evaluates a trained policy.

The checkpoint is a freshly initialised network saved exactly as ``podium train`` saves one
(safetensors + sha256 sidecar, network shape and pool agents in the metadata): what is under
test is the benchmark's plumbing (loading, verification, the JSON, the errors), not how good
an untrained policy schedules.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from podium.envs.swarm import EnvConfig, SwarmEnv, default_pool
from podium.envs.swarm.benchmark import bench_scheduling, run_episode, warm_up
from podium.envs.swarm.generator import generate_task
from podium.envs.swarm.spec import load_tasks, task_to_dict
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.policy.agent import SwarmAgent
from podium.policy.swarm import LearnedPolicy, save_policy
from podium_app.cli import main

ROOT = Path(__file__).resolve().parents[3]
EPISODES = 2
SEED = 3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small task file and a tiny policy checkpoint for the default pool."""
    root = tmp_path_factory.mktemp("bench_learned")
    task = root / "layered.json"
    task.write_text(json.dumps(task_to_dict(generate_task("layered", 6, 1, name="layered"))))
    # A wider layout than the task needs: the set encoder must carry over to any task size.
    layout_env = SwarmEnv(
        load_tasks(task, default_pool()), default_pool(), EnvConfig(max_subtasks=16)
    )
    torch.manual_seed(0)
    agent = SwarmAgent(layout_env.layout, d_model=16, layers=1)
    ref = save_policy(agent.net, root / "ckpt", 1, tuple(layout_env.layout.agents))
    return {"task": task, "checkpoint": ref.path, "run_dir": root / "ckpt"}


def _bench(*extra: str, out: Path | None = None) -> int:
    args = ["bench", "scheduling", "--episodes", str(EPISODES), "--seed", str(SEED), *extra]
    return main([*args, "--json", str(out)] if out else args)


def test_learned_policy_is_benchmarked_against_the_rule_engines(
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps the table to the terminal width
    out = tmp_path / "out.json"
    rc = _bench(
        "--tasks",
        str(files["task"]),
        "--policies",
        "greedy,cpls,learned",
        "--checkpoint",
        str(files["run_dir"]),  # a run/artifact directory resolves to its newest version
        out=out,
    )
    assert rc == 0, capsys.readouterr().err
    assert "learned" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["config"]["policies"] == ["sequential", "greedy", "cpls", "learned"]
    assert data["config"]["checkpoint"] == str(files["run_dir"])
    (task,) = data["tasks"]
    learned = task["policies"]["learned"]
    seq = task["policies"]["sequential"]
    assert learned["ratio_to_bound"] == pytest.approx(learned["latency_mean"] / task["lower_bound"])
    assert learned["reduction_vs_sequential"] == pytest.approx(
        1 - learned["latency_mean"] / seq["latency_mean"]
    )
    assert 0.0 <= learned["completion_rate"] <= 1.0
    assert set(data["summary"]) == {"sequential", "greedy", "cpls", "learned"}
    assert data["summary"]["learned"]["ratio_to_bound_mean"] == pytest.approx(
        learned["ratio_to_bound"]
    )

    # The figures are the checkpoint's own: the same episodes run by hand agree exactly (on a
    # statistics store warmed as the bench warms each policy's, since the policy reads it).
    tasks = load_tasks(files["task"], default_pool())
    env = SwarmEnv(
        tasks,
        default_pool(),
        EnvConfig(max_subtasks=len(tasks[0].subtasks)),
        stats=AgentStats(),
    )
    warm_up(env, tasks, 10, SEED)  # --warmup's default
    policy = LearnedPolicy.from_checkpoint(files["checkpoint"])
    runs = [run_episode(env, policy, tasks[0].name, SEED + e) for e in range(EPISODES)]
    assert learned["latency_mean"] == pytest.approx(statistics.fmean(r.latency for r in runs))
    assert learned["completion_rate"] == sum(r.completed for r in runs) / EPISODES
    assert learned["steps_mean"] == statistics.fmean(r.steps for r in runs)


def test_checkpoint_errors_name_the_flag_without_a_traceback(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = ["--tasks", str(files["task"])]
    assert _bench(*task, "--policies", "cpls,learned") == 2
    assert "give the trained policy with --checkpoint PATH" in capsys.readouterr().err

    assert _bench(*task, "--policies", "cpls", "--checkpoint", str(files["checkpoint"])) == 2
    assert "--checkpoint" in capsys.readouterr().err

    missing = tmp_path / "nowhere"
    assert _bench(*task, "--policies", "learned", "--checkpoint", str(missing)) == 2
    err = capsys.readouterr().err
    assert f"--checkpoint {missing}" in err and "no policy checkpoint" in err

    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for src in files["checkpoint"].parent.iterdir():
        (tampered / src.name).write_bytes(src.read_bytes())
    weights = tampered / files["checkpoint"].name
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert _bench(*task, "--policies", "learned", "--checkpoint", str(weights)) == 2
    err = capsys.readouterr().err
    assert "sha256 mismatch" in err and "Traceback" not in err

    # A policy trained on another pool decides on this one: agents are read by features.
    pool = tmp_path / "pool.yaml"
    pool.write_text("agents:\n  - {name: solo, kinds: {'*': {speed: 1}}}\n")
    args = ("--policies", "learned", "--checkpoint", str(files["checkpoint"]), "--pool", str(pool))
    assert _bench(*task, *args) == 0, capsys.readouterr().err
    capsys.readouterr()

    with pytest.raises(SystemExit):
        _bench(*task, "--policies", "cpls,clever")
    err = capsys.readouterr().err
    assert "unknown policy 'clever'" in err and "learned" in err.split("known:")[1]


def test_extra_policies_are_named_and_cannot_replace_the_reference(
    files: dict[str, Path],
) -> None:
    tasks = load_tasks(files["task"], default_pool())
    policy = LearnedPolicy.from_checkpoint(files["checkpoint"])
    with pytest.raises(ConfigError, match="reserved"):
        bench_scheduling(tasks, default_pool(), ["cpls"], 1, 0, extra={"sequential": policy})
    with pytest.raises(ConfigError, match=r"unknown policy 'mine'; known: .*net"):
        bench_scheduling(tasks, default_pool(), ["mine"], 1, 0, extra={"net": policy})
    # An extra policy under any name runs like the built-in ones.
    got = bench_scheduling(tasks, default_pool(), ["net"], 1, 0, extra={"net": policy})
    assert got["config"]["policies"] == ["sequential", "net"]


def test_rule_engine_benchmark_never_imports_torch(files: dict[str, Path]) -> None:
    code = (
        "import sys\n"
        "from podium_app.cli import main\n"
        f"rc = main(['bench', 'scheduling', '--tasks', {str(files['task'])!r}, '--episodes', '1'])\n"
        "assert rc == 0, rc\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
