"""The Prometheus endpoint serves the platform's metrics, moved by the services' real work.

One meter provider per process (:func:`podium.metrics.setup_metrics`): the embedded demo's
four services record into it side by side without a duplicate registration, and a scrape of
the endpoint, parsed by ``prometheus_client``, shows every metric family of the contract with
values that the work moved (counters by what was done, gauges at what they measured).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from metrics_helpers import exercise_every_metric, label_values, scrape, value

from podium.errors import ConfigError
from podium.metrics import METRIC_NAMES, MetricsServer, setup_metrics
from podium.v1 import subtask_pb2
from reward_svc.config import RewardServiceConfig
from subagent_svc.config import SubagentConfig


@pytest.fixture
def endpoint() -> Iterator[int]:
    """The process's metrics on a free loopback port."""
    server = MetricsServer(0, host="127.0.0.1", registry=setup_metrics("podium-tests"))
    port = server.start()
    try:
        yield port
    finally:
        server.stop()


async def test_real_work_moves_every_metric(endpoint: int, tmp_path: Path) -> None:
    before = scrape(endpoint)
    work = await exercise_every_metric(tmp_path)
    after = scrape(endpoint)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    demo = work.demo
    assert demo is not None and demo.completed and demo.trajectory is not None
    orch = {"service": "orchestrator_svc"}
    assert moved("podium_sessions_total", outcome="succeeded", **orch) == 1
    assert moved("podium_sessions_total", outcome="failed", **orch) == 0
    decisions = len(demo.trajectory.decisions)
    assert decisions > 0
    assert moved("podium_decisions_total", **orch) == decisions
    assert moved("podium_decision_latency_seconds_count", **orch) == decisions
    assert moved("podium_decision_latency_seconds_sum", **orch) > 0
    # The rule engine decided: the live version is 0 (no learned version).
    assert value(after, "podium_live_policy_version", **orch) == 0
    assert "podium_live_policy_version" in after

    # Sub-agent executions, by agent and outcome, exactly as the workers reported them.
    for _worker, result in demo.executions:
        outcome = subtask_pb2.Outcome.Name(result.outcome).removeprefix("OUTCOME_").lower()
        assert moved(
            "podium_subagent_executions_total",
            service="subagent_svc",
            agent=result.agent,
            outcome=outcome,
        ) == sum(
            1 for _, r in demo.executions if r.agent == result.agent and r.outcome == result.outcome
        )
    assert moved("podium_subagent_executions_total") == len(demo.executions)

    # Every consumer reports its lag by topic and group; the poisoned one was 2 behind.
    groups = label_values(after, "podium_consumer_lag", "group")
    subagent_group = SubagentConfig(bus_url="inproc://").group_id
    reward_group = RewardServiceConfig(bus_url="inproc://").group_id
    assert {subagent_group, reward_group, work.poison_group} <= groups
    assert work.lag_after_first_fetch == 2
    assert moved("podium_dead_letters_total", topic=work.poison_topic, group=work.poison_group) == 3

    # The reward service: one histogram point per weighted component per scored trajectory
    # (the demo's and the tool abuser's), and the detectors that charged a penalty fired.
    assert demo.scored is not None and work.abuse is not None
    scored = [demo.scored, work.abuse]
    components = {name for s in scored for name in s.components}
    assert components
    assert label_values(after, "podium_reward_component_count", "component") >= components
    for name in components:
        points = sum(1 for s in scored if name in s.components)
        assert (
            moved("podium_reward_component_count", component=name, service="reward_svc") == points
        )
        total = sum(s.components[name] for s in scored if name in s.components)
        assert moved("podium_reward_component_sum", component=name) == pytest.approx(total)
    assert work.fired
    for detector in work.fired:
        assert moved("podium_detector_firings_total", detector=detector) >= 1

    # The learner: 16 samples in two updates, the second batch one version behind.
    assert work.trained == 16
    assert moved("podium_learner_samples_total", service="learner_svc") == 16
    assert value(after, "podium_learner_policy_lag", service="learner_svc") == 1

    # Every family of the contract is in the scrape under its documented name.
    names = {n.removesuffix("_bucket") for n in after}
    assert set(METRIC_NAMES) <= names, set(METRIC_NAMES) - names
    # The process is described once (resource), not once per service.
    assert len(after["target_info"]) == 1


def test_second_setup_in_one_process_is_the_same_registry() -> None:
    """Embedded services each asking for metrics get the one provider: no duplicates."""
    assert setup_metrics("a") is setup_metrics("b")


def test_bad_port_is_named() -> None:
    with pytest.raises(ConfigError, match="metrics port 70000"):
        MetricsServer(70000, registry=setup_metrics("podium-tests"))
