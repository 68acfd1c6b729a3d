"""``bench/observed_world.py``: the world a live store saw after a cycle's drift, as a pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_helpers import MISADVERTISED, V8, load_bench

from podium.envs.swarm.spec import load_pool


def _flags(tmp_path: Path, *more: str) -> list[str]:
    return [
        "--pool", str(MISADVERTISED), "--drift", "costly-merges", "--duration-s", "60",
        "--drift-at-s", "20", "--window-s", "10", "--rate", "2", "--seed", "0",
        "--work-dir", str(tmp_path / "work"), *more,
    ]  # fmt: skip


def test_the_written_pool_is_the_advertisement_with_what_the_store_saw(tmp_path: Path) -> None:
    """The advertisement unchanged; as its truth, the store's estimates: merges costlier
    than advertised (the drift made them 8x), agents as observed, never the true profiles."""
    out = tmp_path / "observed.yaml"
    flags = _flags(tmp_path, "--checkpoint", str(V8), "--after-s", "40", "--out", str(out))
    assert load_bench("observed_world").main(flags) == 0
    observed, pool = load_pool(out), load_pool(MISADVERTISED)
    assert observed.advertised().agents == pool.advertised().agents
    assert observed.split_overhead == pool.split_overhead
    assert observed.true_split_overhead is not None
    assert observed.true_split_overhead > 2 * pool.split_overhead
    truth = observed.true_spec()
    assert truth.agents != pool.advertised().agents  # estimates moved from the advertisement
    assert truth.agents != pool.true_spec().agents  # and are not the truth either


@pytest.mark.parametrize(
    ("more", "words"),
    [
        (["--checkpoint", str(V8), "--after-s", "-1", "--out", "x.yaml"], "--after-s"),
        (["--out", "x.yaml"], "--checkpoint"),
        (["--checkpoint", "/nonexistent/p.safetensors", "--out", "x.yaml"], "/nonexistent"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(
    tmp_path: Path, more: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_bench("observed_world").main(_flags(tmp_path, *more)) == 2
    assert words in capsys.readouterr().err
