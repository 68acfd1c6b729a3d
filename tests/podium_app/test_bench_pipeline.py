"""``podium bench pipeline`` (issue 17): the measurement's parts, its flags, and a short run
of the command as a user runs it (a process) on the shared broker.

What could fail and is asserted: a bad flag exits 2 with one line naming it; the percentile,
the CPU clock of a process and the per-service CPU charge of the embedded deployment measure
what they say (a task burning CPU in one service's context is charged to it, not to another);
the end-to-end run writes the documented JSON shape, every session submitted in each
deployment finished exactly once, decisions were made and CPU was measured, every published
version decided a session (p50 <= p99, all positive), and every process it started stopped.
The acceptance figures need a full run (bench/README.md), not this one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner_svc.algorithms.swarm import swarm_layout
from podium import topics
from podium.bus import InProcBus
from podium.bus.base import Headers, RecordMetadata
from podium.envs.swarm import default_tasks
from podium.envs.swarm.spec import default_pool
from podium.errors import PodiumError
from podium.policy.agent import SwarmAgent
from podium.policy.swarm import save_policy
from podium_app.pipeline import (
    SERVICE,
    Load,
    LoadedVersions,
    LoopCpu,
    PipelineConfig,
    loaded_from_log,
    percentile,
    process_cpu_s,
    summarise,
    validate,
)

ROOT = Path(__file__).resolve().parents[2]
PODIUM = str(Path(sys.executable).with_name("podium"))


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"bus": "inproc://"}, "--bus"),
        ({"workers": 0}, "--workers"),
        ({"sessions": 0}, "--sessions"),
        ({"versions": 0}, "--versions"),
        ({"rate": -1.0}, "--rate"),
        ({"rate": float("nan")}, "--rate"),
        ({"warmup": -1}, "--warmup"),
        ({"tasks": 0}, "--tasks"),
        ({"timeout_s": 0.0}, "--timeout-s"),
        ({"checkpoint": Path("/nonexistent/policy.safetensors")}, "--checkpoint"),
    ],
)
def test_a_bad_setting_is_named(change: dict[str, object], flag: str) -> None:
    with pytest.raises(ValueError, match=f"^{flag}: "):
        validate(PipelineConfig(**change))  # type: ignore[arg-type]


def test_a_bad_flag_exits_2_with_one_line_naming_it() -> None:
    proc = subprocess.run(
        [PODIUM, "bench", "pipeline", "--workers", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "podium bench pipeline: error: --workers: must be >= 1"
    ]


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 0.0], 100) == 10.0
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarise_refuses_an_unmeasured_batch() -> None:
    with pytest.raises(PodiumError, match="no time measured"):
        summarise(10, 100, 1.0, 0.0, 1.0)
    out = summarise(10, 200, 2.0, 0.5, 1.0)
    assert out["sessions_per_s"] == 5.0 and out["decisions_per_s"] == 100.0
    assert out["orchestrator_cores"] == 0.25 and out["decisions_per_s_per_core"] == 400.0


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_process_cpu_counts_this_process_work() -> None:
    before = process_cpu_s(os.getpid())
    _burn(0.2)
    assert process_cpu_s(os.getpid()) - before >= 0.15


async def test_loop_cpu_charges_each_service_its_own_work() -> None:
    cpu = LoopCpu()

    async def work(seconds: float) -> None:
        for _ in range(4):
            _burn(seconds / 4)
            await asyncio.sleep(0)

    with cpu.installed():
        token = SERVICE.set("orchestrator")
        try:
            busy = asyncio.create_task(work(0.3))  # inherits the context: the orchestrator's
        finally:
            SERVICE.reset(token)
        light = asyncio.create_task(work(0.05))
        await asyncio.gather(busy, light)
    assert 0.25 <= cpu.total("orchestrator") <= 0.6, cpu.by_service
    assert cpu.total("") < 0.2, cpu.by_service
    # Uninstalled: nothing more is charged (once the step that uninstalled it has ended).
    await asyncio.sleep(0)
    charged = dict(cpu.by_service)
    await work(0.05)
    assert cpu.by_service == charged


class _SlowBus(InProcBus):
    """An in-process bus whose publishes take a while, and which counts those that landed."""

    landed = 0

    async def publish(
        self, topic: str, value: bytes, *, key: bytes | str | None = None, headers: Headers = ()
    ) -> RecordMetadata:
        await asyncio.sleep(0.01)
        metadata = await super().publish(topic, value, key=key, headers=headers)
        if topic == topics.TASKS:
            self.landed += 1
        return metadata


async def test_a_stopped_steady_load_counted_every_session_it_published() -> None:
    """The version pick-up's load is stopped, not cancelled mid-publish: a session published
    but not counted finished as one more than was submitted (finished 51 of 50, in CI)."""
    bus = _SlowBus()
    await bus.start()
    try:
        load = Load(bus, "steady", default_tasks()[:2], seed=0)
        for pause in (0.05, 0.13, 0.2):
            stop = asyncio.Event()
            loader = asyncio.create_task(load.steady(200.0, stop))
            await asyncio.sleep(pause)
            stop.set()
            await asyncio.wait_for(loader, 5)
            assert load.submitted == bus.landed > 0
    finally:
        await bus.stop()


def test_loaded_versions_are_read_from_the_log_and_the_records_alike() -> None:
    log = (
        "2026-12-01 08:37:50,160 INFO orchestrator_svc.learned: loaded swarm_policy v0 (file:///a) "
        "trace_id=x span_id=y\n"
        "2026-12-01 08:37:51,000 ERROR orchestrator_svc.learned: refused swarm_policy v9: bad\n"
        "2026-12-01 08:37:57,199 INFO orchestrator_svc.learned: loaded swarm_policy v1 (file:///b)\n"
        "2026-12-01 08:37:58,000 INFO orchestrator_svc.learned: loaded swarm_policy v1 (again)\n"
    )
    loaded = loaded_from_log(log)
    assert set(loaded) == {0, 1}
    assert loaded[1] - loaded[0] == pytest.approx(7.039, abs=1e-6)
    base = time.mktime(time.strptime("2026-12-01 08:37:50", "%Y-%m-%d %H:%M:%S"))
    assert loaded[0] == pytest.approx(base + 0.160)

    handler = LoadedVersions()
    logger = logging.getLogger("orchestrator_svc.learned")
    with handler.attached():
        logger.info("loaded %s v%d (%s)", "swarm_policy", 3, "file:///c")
        logger.info("serving %s v%s on %s (%s)", "swarm_policy", 4, "v2://x", "file:///d")
    logger.info("loaded %s v%d (%s)", "swarm_policy", 5, "file:///e")  # detached: not seen
    assert list(handler.loaded) == [3]
    assert abs(handler.loaded[3] - time.time()) < 5


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_bench_pipeline_end_to_end(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A short run on the shared broker (``--bus``): groups and transactional ids of the run's
    own, positioned at the topics' ends; sessions told apart by the run's id prefix."""
    layout = swarm_layout(default_pool(), 16)
    init = save_policy(
        SwarmAgent(layout).net, tmp_path / "init", 0, tuple(layout.agents), max_subtasks="16"
    ).path
    out = tmp_path / "pipeline.json"
    args = [PODIUM, "bench", "pipeline", "--bus", kafka_bootstrap, "--workers", "2"]
    args += ["--sessions", "24", "--versions", "3", "--warmup", "4"]
    args += ["--checkpoint", str(init), "--timeout-s", "120"]
    args += ["--work-dir", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=220, check=False)
    logs = "\n".join(
        f"--- {p}\n{p.read_text(errors='replace')[-2000:]}"
        for p in sorted((tmp_path / "work").glob("*/logs/*.log"))
    )
    assert proc.returncode == 0, f"{proc.stderr[-4000:]}\n{logs}"
    assert "[kafka] throughput" in proc.stderr and "[embedded] throughput" in proc.stderr

    result = json.loads(out.read_text())
    assert {"kafka", "embedded", "policy_update_to_first_session_ms", "verdicts"} <= set(result)
    for name in ("kafka", "embedded"):
        run = result[name]
        assert run["sessions_per_s"] > 0 and run["decisions_per_s_per_core"] > 0, run
        assert run["sessions"] == 24 and run["decisions"] > 24, run
        assert run["orchestrator_cpu_s"] > 0, run
        assert run["submitted"] >= 24 + 4 + 1, run
        assert run["finished"] == run["submitted"], run
        assert run["run_twice"] == 0, run
        pickup = run["policy_update_to_first_session_ms"]
        assert pickup["versions"] == 3 and len(pickup["samples_ms"]) == 3, pickup
        # The default load while versions are published: half the throughput just measured.
        assert pickup["rate"] == max(1.0, round(run["sessions_per_s"] / 2, 1)), pickup
        assert 0 < pickup["p50"] <= pickup["p99"] <= pickup["max"], pickup
        # Where the time went: the orchestrator logged each version loaded before any session
        # it decided started.
        assert pickup["to_loaded_p50"] >= 0 and pickup["loaded_to_first_session_p50"] >= 0, pickup
    assert (
        result["policy_update_to_first_session_ms"]
        == (result["kafka"]["policy_update_to_first_session_ms"])
    )
    codes = result["kafka"]["exit_codes"]
    assert set(codes) == {"orchestrator", "reward", "learner", "subagent-1", "subagent-2"}
    assert all(code in (0, -15) for code in codes.values()), codes
    verdicts = result["verdicts"]
    assert isinstance(verdicts["per_core_at_least_half_of_embedded"], bool)
    assert isinstance(verdicts["pickup_p99_within_1s"], bool)
