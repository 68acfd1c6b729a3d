"""``bench/split_headroom.py``: the same policies on the same sessions with and without splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import MISADVERTISED, V8, load_bench


def test_costly_merges_turn_splitting_from_a_gain_into_a_loss(tmp_path: Path) -> None:
    """Where merges cost 8x what the spec says, not splitting is faster, and by far more than
    where they cost what it says, for the learned policy and cpls-online alike (the same
    sessions, paired)."""
    bench = load_bench("split_headroom")
    figures = {}
    for drift in ("none", "costly-merges"):
        out = tmp_path / f"{drift}.json"
        flags = ["--pool", str(MISADVERTISED), "--drift", drift, "--checkpoint", str(V8)]
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
    base = ["--pool", str(MISADVERTISED), "--checkpoint", str(V8)]
    assert load_bench("split_headroom").main([*base, *flags]) == 2
    assert words in capsys.readouterr().err
