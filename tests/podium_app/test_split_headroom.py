"""``bench/split_headroom.py``: the same policies on the same sessions with and without splits."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
V8 = ROOT / "bench" / "policies" / "misadvertised-v8" / "policy.safetensors"
POOL = ROOT / "podium" / "data" / "pools" / "misadvertised.yaml"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "split_headroom", ROOT / "bench" / "split_headroom.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_costly_merges_turn_splitting_from_a_gain_into_a_loss(tmp_path: Path) -> None:
    """Where merges cost 8x what the spec says, not splitting is faster, and by far more than
    where they cost what it says, for the learned policy and cpls-online alike (the same
    sessions, paired)."""
    bench = _bench()
    figures = {}
    for drift in ("none", "costly-merges"):
        out = tmp_path / f"{drift}.json"
        flags = ["--pool", str(POOL), "--drift", drift, "--checkpoint", str(V8)]
        assert bench.main([*flags, "--sessions", "96", "--seed", "0", "--json", str(out)]) == 0
        figures[drift] = json.loads(out.read_text())
    assert figures["none"]["config"]["true_split_overhead"] == pytest.approx(0.15)
    assert figures["costly-merges"]["config"]["true_split_overhead"] == pytest.approx(1.2)
    for name in ("learned", "cpls-online"):
        plain, costly = (figures[d]["policies"][name]["paired"] for d in ("none", "costly-merges"))
        assert costly["mean"] < 0 and costly["mean"] < plain["mean"] - 0.1, (name, plain, costly)
        assert costly["differ"] > 0.3


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--sessions", "1"], "--sessions: must be >= 2"),
        (["--drift", "nope"], "unknown drift scenario 'nope'"),
        (["--checkpoint", "/nonexistent/policy.safetensors"], "/nonexistent/policy.safetensors"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--pool", str(POOL), "--checkpoint", str(V8)]
    assert _bench().main([*base, *flags]) == 2
    assert words in capsys.readouterr().err
