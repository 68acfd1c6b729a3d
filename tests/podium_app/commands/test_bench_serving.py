"""``podium bench serving`` end to end against the real V2 server (short phases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium_app.cli import main

KEYS = {"p50_ms", "p99_ms", "per_s"}


def _check_report(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    report: dict[str, dict[str, dict[str, float]]] = json.loads(path.read_text())
    assert set(report) == {"local", "served"}
    for backend in ("local", "served"):
        assert set(report[backend]) == {"batch1", "batched"}
        for phase in ("batch1", "batched"):
            row = report[backend][phase]
            assert set(row) == KEYS
            assert 0 < row["p50_ms"] <= row["p99_ms"], (backend, phase, row)
            assert row["per_s"] > 0
        # Batching amortises the per-call cost: 16 observations per call must beat one.
        assert report[backend]["batched"]["per_s"] > report[backend]["batch1"]["per_s"], backend
    return report


@pytest.mark.serving
def test_bench_serving_reports_local_and_served(
    v2_grpc: str, v2_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench", "serving", "--json", str(out), "--seconds", "0.4", "--batch", "16",
            "--subtasks", "12", "--server", f"v2://{v2_grpc}", "--repository", str(v2_repository),
        ]
    )  # fmt: skip
    assert rc in (0, 1)  # 1 = targets missed on a busy machine; the figures are still valid
    _check_report(out)
    printed = capsys.readouterr().out
    assert "served   batch1" in printed and "targets:" in printed
    # The benchmark cleans up after itself: its model is unloaded from the shared server.
    import tritonclient.grpc as grpcclient
    from serving_helpers import SIGNATURE

    from podium.serving.backends import ServedPolicy

    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        names = [
            m.name
            for m in client.get_model_repository_index().models
            if m.name.startswith("bench_policy_")
        ]
    finally:
        client.close()
    assert names, "the benchmark exported no model into the server's repository"
    for name in names:
        probe = ServedPolicy(v2_grpc, name, SIGNATURE)
        try:
            assert not probe.model_ready(), f"{name} is still loaded"
        finally:
            probe.close()


@pytest.mark.serving
@pytest.mark.slow
def test_bench_serving_starts_and_stops_its_own_server(
    v2_grpc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a server given, the command runs scripts/v2server.sh for itself (a second,
    private server with its own state directory) and stops it afterwards."""
    monkeypatch.delenv("PODIUM_V2_GRPC")
    monkeypatch.delenv("PODIUM_V2_REPOSITORY", raising=False)
    out = tmp_path / "bench.json"
    before = _mlserver_pids()
    rc = main(["bench", "serving", "--json", str(out), "--seconds", "0.3", "--batch", "8"])
    assert rc in (0, 1)
    _check_report(out)
    assert _mlserver_pids() == before, "the private server was left running"


def _mlserver_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"/bin/mlserver") for part in cmdline):
                pids.add(int(proc.name))
    return pids


def test_bench_serving_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "serving", "--seconds", "0"]) == 2
    assert "--seconds > 0" in capsys.readouterr().err
    assert main(["bench", "serving", "--server", "triton:8001", "--repository", "/tmp"]) == 2
    assert "--server 'triton:8001': need a v2://HOST:PORT address" in capsys.readouterr().err
