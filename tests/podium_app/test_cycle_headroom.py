"""``bench/cycle_headroom.py``: candidates against the initial policy on a cycle's sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import MISADVERTISED, V8, load_bench

from podium.policy.network import SwarmPolicyNet
from podium.policy.swarm import load_policy, save_policy


def _flags(tmp_path: Path, *more: str) -> list[str]:
    return [
        "--pool", str(MISADVERTISED), "--drift", "flaky-agent", "--duration-s", "40",
        "--drift-at-s", "10", "--window-s", "10", "--rate", "2", "--seed", "2",
        "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "out.json"), *more,
    ]  # fmt: skip


def test_the_initial_policy_as_its_own_candidate_differs_nowhere_and_another_does(
    tmp_path: Path,
) -> None:
    """The same weights replay every session alike (difference 0 on every session); a fresh,
    untrained network decides otherwise on most of them, and much worse."""
    trained, _ = load_policy(V8)
    fresh = SwarmPolicyNet(trained.config)
    fresh_path = str(save_policy(fresh, tmp_path / "fresh", 1, ("any",)).path)
    code = load_bench("cycle_headroom").main(
        _flags(tmp_path, "--checkpoint", str(V8), "--candidate", str(V8), "--candidate", fresh_path)
    )
    assert code == 0
    out = json.loads((tmp_path / "out.json").read_text())
    same, other = out["candidates"][str(V8)], out["candidates"][fresh_path]
    measured_after_drift = same["post"]["sessions"]
    assert measured_after_drift > 30  # 60 of 80 sessions are greedy, three quarters after 10 s
    assert same["post"] == {"mean": 0.0, "se": 0.0, "differ": 0.0, "sessions": measured_after_drift}
    assert other["post"]["differ"] > 0.5
    assert other["post"]["mean"] > 0.1
    assert out["initial_vs_cpls_online"]["post"]["sessions"] == measured_after_drift
    assert out["config"]["end_from_s"] == 30.0
    # The verdicts if nothing ships read the same sessions: the initial policy's post-drift
    # level minus cpls-online's is the paired difference above.
    verdict = out["if_nothing_ships"]
    levels = verdict["levels"]
    gap = levels["continuous_post"] - levels["cpls_online_post"]
    assert gap == pytest.approx(out["initial_vs_cpls_online"]["post"]["mean"], abs=1e-9)
    assert verdict["better_rule_end"] == min(levels["cpls_end"], levels["cpls_online_end"])
    assert isinstance(verdict["accepted"], bool)


def test_the_drift_is_aimed_as_podium_bench_cycle_aims_it(tmp_path: Path) -> None:
    code = load_bench("cycle_headroom").main(
        _flags(tmp_path, "--checkpoint", str(V8), "--drift-target", "preferred")
    )
    assert code == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["config"]["drift_aimed"]) == 1
    assert out["config"]["drift_aimed"][0].startswith("qa/test -> ")
    assert (tmp_path / "work" / "drift.yaml").is_file()


@pytest.mark.parametrize(
    ("more", "named"),
    [
        ((), "--checkpoint"),
        (
            ("--checkpoint", str(V8), "--candidate", "/nonexistent/policy.safetensors"),
            "--candidate",
        ),
        (("--checkpoint", str(V8), "--rate", "0"), "--rate"),
    ],
)
def test_bad_input_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: tuple[str, ...], named: str
) -> None:
    assert load_bench("cycle_headroom").main(_flags(tmp_path, *more)) == 2
    assert named in capsys.readouterr().err


def test_a_corrupt_candidate_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.safetensors"
    bad.write_bytes(b"not a safetensors file")
    assert (
        load_bench("cycle_headroom").main(
            _flags(tmp_path, "--checkpoint", str(V8), "--candidate", str(bad))
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--candidate" in err and "policy.safetensors" in err
