"""subagent_svc under a drift scenario (PODIUM_SUBAGENT_DRIFT, PODIUM_SUBAGENT_DRIFT_ORIGIN):
results come from the nominal pool before the scenario's change and from the drifted pool
after it, in one running worker; a bad scenario fails start-up naming the setting.

Embedded on the in-process bus only: a drifted worker on the shared Kafka broker would also
answer other tests' assignments (every group gets every assignment) with drifted results.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from podium import codec, topics
from podium.bus import EventPublisher, InProcBus, Subscriber
from podium.config import from_env
from podium.envs.swarm.drift import load_drift
from podium.envs.swarm.pool import SubagentPool
from podium.envs.swarm.spec import default_pool
from podium.errors import ConfigError
from podium.v1 import subtask_pb2, task_pb2
from subagent_svc import SubagentApp, SubagentConfig
from subagent_svc.app import execute

CHANGE_AT_S = 2.0
"""When the test scenario's change takes effect: long enough for a worker to start and answer
one assignment first, short enough to wait for."""


def assignment(n: int, seed: int = 77) -> subtask_pb2.SubtaskAssigned:
    return subtask_pb2.SubtaskAssigned(
        session_id="drift-test",
        execution_id=f"drift-test.r.{n}",
        subtask_id="api",
        kind="api",
        agent="backend",
        attempt=1,
        split_k=1,
        context=subtask_pb2.ExecutionContext(
            subtask=task_pb2.SubtaskSpec(id="api", kind="api", work=4.0)
        ),
        sim_time=0.0,
        seed=seed,
    )


def scenario(tmp_path: Path, body: str) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(body)
    return str(path)


async def run_once(
    publisher: EventPublisher, reader: Subscriber, n: int
) -> subtask_pb2.SubtaskResult:
    """Publish assignment ``n`` and wait for its result."""
    await publisher.publish(topics.SUBTASKS_ASSIGNED, assignment(n), key=f"e{n}")
    for _ in range(100):
        for record in await reader.fetch(timeout_s=0.1):
            _, result = codec.decode_event(record.value, subtask_pb2.SubtaskResult)
            if result.execution_id == assignment(n).execution_id:
                return result
    raise AssertionError(f"no result for assignment {n}")


async def test_results_come_from_the_drifted_pool_after_the_change(
    inproc_bus: InProcBus, tmp_path: Path
) -> None:
    path = scenario(
        tmp_path,
        f"name: soon\nchanges:\n  - {{at_s: {CHANGE_AT_S}, agent: backend, kind: api, "
        "speed_factor: 0.2, success_factor: 0.5}\n",
    )
    origin = time.time()
    config = from_env(
        SubagentConfig,
        {"PODIUM_SUBAGENT_DRIFT": path, "PODIUM_SUBAGENT_DRIFT_ORIGIN": f"{origin:.6f}"},
        bus_url="embedded",
        group_id="drift.subagent",
        shutdown_timeout_s=5.0,
    )
    assert config.drift == path and config.drift_origin == pytest.approx(origin, abs=1e-5)
    worker = SubagentApp(config, inproc_bus)
    reader = inproc_bus.subscriber([topics.SUBTASK_RESULTS], "drift.reader")
    await reader.start()
    await worker.start()
    publisher = EventPublisher(inproc_bus, producer_name="drift-test")
    try:
        before = await run_once(publisher, reader, 1)
        assert time.time() < origin + CHANGE_AT_S, "too slow to see the worker before the change"
        await asyncio.sleep(max(0.0, origin + CHANGE_AT_S + 0.05 - time.time()))
        after = await run_once(publisher, reader, 2)
    finally:
        await worker.stop()
        await reader.stop()
    nominal = SubagentPool(default_pool())
    drifted = SubagentPool(load_drift(path).pool_at(default_pool(), CHANGE_AT_S))
    # Same assignment (same seed, same luck), the outcome of the pool in effect at the time.
    assert before.end_time == execute(nominal, assignment(1)).end_time
    assert after.end_time == execute(drifted, assignment(2)).end_time
    assert after.end_time == pytest.approx(5 * before.end_time)
    assert worker.true_pool.at(time.time()) is not worker.pool  # drifted now
    assert worker.stats.executions == 2


async def test_no_drift_is_the_nominal_pool(inproc_bus: InProcBus) -> None:
    worker = SubagentApp(SubagentConfig(bus_url="embedded", group_id="nodrift"), inproc_bus)
    assert worker.true_pool.at(time.time() + 1e9) is worker.pool
    shipped = SubagentApp(
        SubagentConfig(bus_url="embedded", drift="slow-specialist", drift_origin=0.0), inproc_bus
    )
    api = shipped.true_pool.at(time.time()).profile("backend", "api")
    assert api is not None and api.speed == 0.2  # 60 s after the epoch: long in effect


@pytest.mark.parametrize(
    ("drift", "words"),
    [
        ("slow-specialst", "unknown drift scenario 'slow-specialst'"),
        ("name: w\nchanges: [{at_s: 0, agent: wizard}]", "changes[0].agent: no agent 'wizard'"),
        ("name: w\nchanges: [{at_s: -1, agent: qa}]", "changes[0].at_s must be >= 0"),
    ],
)
def test_a_bad_scenario_fails_start_up_naming_the_setting(
    inproc_bus: InProcBus, tmp_path: Path, drift: str, words: str
) -> None:
    value = scenario(tmp_path, drift) if "\n" in drift else drift
    with pytest.raises(ConfigError) as err:
        SubagentApp(SubagentConfig(bus_url="embedded", drift=value), inproc_bus)
    assert f"PODIUM_SUBAGENT_DRIFT={value!r}" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("origin", ["-5", "soon", "nan", "inf"])
def test_a_bad_origin_is_a_config_error(origin: str) -> None:
    with pytest.raises(ConfigError, match="PODIUM_SUBAGENT_DRIFT_ORIGIN"):
        from_env(SubagentConfig, {"PODIUM_SUBAGENT_DRIFT_ORIGIN": origin}, bus_url="embedded")


async def test_a_pool_with_true_profiles_and_drift_is_sampled_from_its_truth(
    inproc_bus: InProcBus, tmp_path: Path
) -> None:
    """A pool file's ``true:`` profiles are what executions draw from (the orchestrator plans
    on the advertised ones), and its ``drift:`` applies when PODIUM_SUBAGENT_DRIFT is unset."""
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "name: lying\n"
        "drift: slow-specialist\n"
        "agents:\n"
        "  - name: backend\n"
        "    kinds: {api: {speed: 1.0, success: 0.95, noise: 0.2}}\n"
        "    true: {api: {speed: 0.5}}\n"
    )
    config = SubagentConfig(bus_url="embedded", pool_spec=str(pool_file), drift_origin=0.0)
    worker = SubagentApp(config, inproc_bus)
    advertised = worker.pool.profile("backend", "api")
    assert advertised is not None and advertised.speed == 1.0
    # slow-specialist (backend api x 0.2 from 60 s) over the truth (0.5), long in effect.
    now = worker.true_pool.at(time.time()).profile("backend", "api")
    assert now is not None and now.speed == pytest.approx(0.1)
    assert worker.true_pool.at(30.0).profile("backend", "api").speed == 0.5  # type: ignore[union-attr]
    explicit = SubagentApp(
        SubagentConfig(bus_url="embedded", pool_spec=str(pool_file), drift="none"), inproc_bus
    )
    assert explicit.true_pool.at(time.time()).profile("backend", "api").speed == 0.5  # type: ignore[union-attr]


def _merge(n: int, split_k: int = 2, part: str = "merge") -> subtask_pb2.SubtaskAssigned:
    """Assignment ``n`` as a unit of ``api`` split ``split_k`` ways: its merge (work 0.6 of 4,
    the advertised 0.15 overhead) or chunk ``part``."""
    out = assignment(n)
    out.subtask_id = f"api#{part}"
    out.split_k = split_k
    out.context.subtask.id = out.subtask_id
    out.context.subtask.work = 0.6 if part == "merge" else 2.0
    return out


async def test_merges_cost_what_the_true_pool_says(inproc_bus: InProcBus, tmp_path: Path) -> None:
    """The orchestrator plans a merge at the advertised overhead; the worker draws it at the
    true one: the pool file's own ``true: {split_overhead: ...}``, times the drift's
    ``merge_factor`` once that is in effect. A chunk is not a merge."""
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text(
        "name: costly\n"
        "split_overhead: 0.15\n"
        "true: {split_overhead: 0.3}\n"
        "agents:\n"
        "  - name: backend\n"
        "    kinds: {api: {speed: 1.0, success: 0.95, noise: 0.2}}\n"
    )
    drift = scenario(tmp_path, "name: m\nchanges: [{at_s: 60, merge_factor: 4}]\n")
    config = SubagentConfig(
        bus_url="embedded", pool_spec=str(pool_file), drift=drift, drift_origin=time.time()
    )
    worker = SubagentApp(config, inproc_bus)
    plain = SubagentPool(default_pool())
    merge, chunk = _merge(1), _merge(2, part="1")
    expected = execute(plain, merge).end_time
    assert (await worker._execute(merge, None)).end_time == pytest.approx(2 * expected)
    assert (await worker._execute(chunk, None)).end_time == execute(plain, chunk).end_time
    worker.true_pool.origin -= 61  # the drift's change is now in effect
    assert (await worker._execute(merge, None)).end_time == pytest.approx(8 * expected)
    assert (await worker._execute(chunk, None)).end_time == execute(plain, chunk).end_time
