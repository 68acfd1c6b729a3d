"""``podium bench rollout`` end to end through ``podium_app.cli.main``: the documented JSON on
the in-process bus and on the real broker, and bad input refused before anything is timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium_app.cli import main


def _check_schema(data: dict[str, object], *, bus: str, sessions: int, replicas: int) -> None:
    per_core = data["twin_sessions_per_s_per_core"]
    assert isinstance(per_core, float) and per_core > 0
    prop = data["promote_propagation_ms"]
    assert isinstance(prop, dict) and set(prop) == {"p50", "p99"}
    assert 0 < prop["p50"] <= prop["p99"]
    config = data["config"]
    assert isinstance(config, dict)
    assert config["bus"] == bus and config["sessions"] == sessions
    assert config["replicas"] == replicas
    twins = data["twins"]
    assert isinstance(twins, dict)
    # Both twins of a pair count, and per core is per CPU-second of the timed evaluation.
    assert twins["twin_sessions"] == 2 * sessions and twins["threads"] == 1
    assert twins["twin_sessions_per_s_per_core"] == pytest.approx(
        twins["twin_sessions"] / twins["cpu_s"], rel=1e-9
    )
    assert per_core == pytest.approx(twins["twin_sessions_per_s_per_core"], abs=0.01)
    propagation = data["propagation"]
    assert isinstance(propagation, dict)
    assert propagation["changes"] == sessions and propagation["replicas"] == replicas


def test_bench_rollout_in_process_writes_the_documented_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rollout.json"
    rc = main(["bench", "rollout", "--json", str(out), "--sessions", "6", "--replicas", "3"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "shadow twins: 12 sessions (6 pairs" in printed
    assert "promote propagation to 3 replicas (inproc, 6 changes)" in printed
    _check_schema(json.loads(out.read_text()), bus="inproc", sessions=6, replicas=3)


@pytest.mark.kafka
def test_bench_rollout_on_kafka(tmp_path: Path, kafka_bootstrap: str) -> None:
    out = tmp_path / "rollout.json"
    rc = main(
        [
            "bench",
            "rollout",
            "--json",
            str(out),
            "--sessions",
            "4",
            "--replicas",
            "2",
            "--bus",
            kafka_bootstrap,
        ]
    )
    assert rc == 0
    _check_schema(json.loads(out.read_text()), bus="kafka", sessions=4, replicas=2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sessions", "0"], "--sessions must be >= 1"),
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--bus", "redis://x"], "bus URL must be"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "never.json"
    assert main(["bench", "rollout", "--json", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_unwritable_json_path_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing-dir" / "out.json"
    assert main(["bench", "rollout", "--json", str(out), "--sessions", "2", "--replicas", "1"]) == 2
    assert "its directory does not exist" in capsys.readouterr().err
