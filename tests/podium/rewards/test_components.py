"""Reward components (PARL, multi-objective, multi-stage) and credit assignment."""

from __future__ import annotations

import math

import pytest

from podium.errors import ProcessingError
from podium.rewards import InvalidTrajectoryError, default_config, load_config, score
from podium.rewards import examples as ex
from podium.rewards.components import effective_parallelism, latency_ratio
from podium.rewards.config import config_from_mapping
from podium.rewards.facts import critical_subtasks
from podium.rewards.score import progress_from_policy_version
from podium.v1 import task_pb2, trajectory_pb2

CFG = default_config()
PARL = config_from_mapping(
    {
        "name": "parl-test",
        "mix": {"parl": 1.0, "multi_objective": 0.0, "multi_stage": 0.0},
        "parl": {
            "lambda1": {"kind": "linear", "start": 0.4, "end": 0.0, "updates": 100},
            "lambda2": {"kind": "cosine", "start": 0.2, "end": 0.0, "updates": 100},
        },
    }
)
STAGED = config_from_mapping({"mix": {"parl": 0, "multi_objective": 0, "multi_stage": 1}})


def _independent(
    n: int, starts: list[float], *, max_parallel: int = 4
) -> trajectory_pb2.Trajectory:
    """n independent subtasks of work 2, started at the given times, each taking 2."""
    task = task_pb2.TaskSpec(
        name="flat",
        max_parallel=max_parallel,
        subtasks=[task_pb2.SubtaskSpec(id=f"s{i}", kind="code", work=2.0) for i in range(n)],
    )
    execs = [ex.execution(f"e{i}", f"s{i}", t, t + 2.0) for i, t in enumerate(starts)]
    end = max(t + 2.0 for t in starts)
    return trajectory_pb2.Trajectory(
        trajectory_id="flat",
        task=task,
        executions=execs,
        latency=end,
        lower_bound=2.0,
        completed=True,
        claimed_success=True,
        test_coverage=-1.0,
    )


def test_effective_parallelism_counts_concurrent_sub_agents() -> None:
    assert effective_parallelism(_independent(4, [0, 0, 0, 0]).executions) == 4.0
    assert effective_parallelism(_independent(4, [0, 2, 4, 6]).executions) == 1.0
    assert effective_parallelism(_independent(4, [0, 0, 2, 2]).executions) == 2.0


def test_parl_r_parallel_rewards_parallel_and_not_serial_runs() -> None:
    par = score(_independent(4, [0, 0, 0, 0]), PARL, 0)
    ser = score(_independent(4, [0, 2, 4, 6]), PARL, 0)
    half = score(_independent(4, [0, 0, 2, 2]), PARL, 0)
    assert par.raw["parl.parallel"] == 1.0
    assert ser.raw["parl.parallel"] == 0.0
    assert half.raw["parl.parallel"] == pytest.approx(1 / 3)  # (2 − 1) / (4 − 1)
    assert par.components["parl.parallel"] == pytest.approx(0.4)


def test_parl_r_finish_counters_spurious_parallelism() -> None:
    t = _independent(4, [0, 0, 0, 0])
    for i in range(4):  # four extra parallel sub-agents that all fail
        t.executions.append(ex.execution(f"f{i}", f"s{i}", 0.0, 1.0, ex.F))
    b = score(t, PARL, 0)
    assert b.raw["parl.finish"] == 0.5
    assert b.raw["parl.perf"] == 1.0


def test_parl_lambdas_anneal_to_zero_leaving_r_perf() -> None:
    t = _independent(4, [0, 0, 0, 0])
    start, mid, end = (score(t, PARL, p) for p in (0, 50, 100))
    assert start.weights["parl.parallel"] == 0.4 and start.weights["parl.finish"] == 0.2
    assert mid.weights["parl.parallel"] == pytest.approx(0.2)
    assert mid.weights["parl.finish"] == pytest.approx(0.1)
    assert end.weights["parl.parallel"] == 0.0
    assert end.weights["parl.finish"] == pytest.approx(0.0, abs=1e-15)
    assert end.total == pytest.approx(end.raw["parl.perf"]) == pytest.approx(1.0)
    assert (start.schedule_step, mid.schedule_step) == (0, 50)


def test_multi_objective_efficiency_is_measured_against_the_lower_bound() -> None:
    assert latency_ratio(8.0, 16.0) == 0.5
    assert latency_ratio(8.0, 4.0) == 1.0  # faster than the bound (lucky draws) is capped
    assert latency_ratio(0.0, 4.0) == 0.0
    # Two tasks of different size, each at twice its bound, get the same efficiency.
    small = _independent(2, [0, 0], max_parallel=2)
    small.latency, small.lower_bound = 4.0, 2.0
    big = _independent(8, [0] * 8, max_parallel=8)
    big.lower_bound, big.latency = 50.0, 100.0
    assert score(small, CFG, 0).raw["multi_objective.efficiency"] == 0.5
    assert score(big, CFG, 0).raw["multi_objective.efficiency"] == 0.5


def test_efficiency_weight_anneals_from_point_3_to_point_05() -> None:
    mo = load_config("podium/data/rewards/multi_objective.yaml")
    t = ex.clean()
    early, late = score(t, mo, 0), score(t, mo, mo.multi_objective.efficiency.updates)
    assert early.weights == pytest.approx(
        {
            "multi_objective.completion": 0.4,
            "multi_objective.efficiency": 0.3,
            "multi_objective.quality": 0.3,
        }
    )
    assert late.weights["multi_objective.efficiency"] == pytest.approx(0.05)
    assert late.weights["multi_objective.completion"] == 0.4


def test_quality_counts_only_verified_completions() -> None:
    t = ex.clean()
    t.executions[1].verified = False  # "a" done but unverified
    b = score(t, CFG, 0)
    assert b.raw["multi_objective.completion"] == 1.0
    assert b.raw["multi_objective.quality"] == 0.75


def test_multi_stage_weights_and_stage_scores() -> None:
    b = score(ex.failed_on_critical_path(), STAGED, 0)
    assert b.weights == pytest.approx(
        {"multi_stage.design": 0.2, "multi_stage.implement": 0.5, "multi_stage.verify": 0.3}
    )
    assert b.raw == {
        "multi_stage.design": 1.0,
        "multi_stage.implement": 0.5,
        "multi_stage.verify": 0.0,
    }
    assert b.total == pytest.approx(0.2 + 0.25)


def test_multi_stage_renormalises_over_stages_the_task_has() -> None:
    b = score(_independent(2, [0, 0]), STAGED, 0)  # only "implement" subtasks
    assert b.weights == {"multi_stage.implement": 1.0}
    assert b.total == pytest.approx(1.0)


def test_untagged_executions_take_their_stage_from_the_subtask_kind() -> None:
    t = ex.clean()
    for e in t.executions:
        e.stage = ""
    b = score(t, STAGED, 0)
    assert set(b.raw) == {"multi_stage.design", "multi_stage.implement", "multi_stage.verify"}


def test_critical_path_is_the_zero_slack_chain() -> None:
    deps = {"d": (), "a": ("d",), "b": ("d",), "t": ("a", "b")}
    work = {"d": 2.0, "a": 4.0, "b": 6.0, "t": 2.0}
    assert critical_subtasks(tuple(deps), deps, work) == {"d", "b", "t"}
    work["a"] = 6.0  # a tie: both chains are critical
    assert critical_subtasks(tuple(deps), deps, work) == {"d", "a", "b", "t"}


# --- credit -----------------------------------------------------------------------------------


def test_credit_names_the_failed_executions_and_stage_on_the_critical_path() -> None:
    b = score(ex.failed_on_critical_path(), CFG, 0)
    assert b.blame is not None
    assert (b.blame.subtask_id, b.blame.stage, b.blame.on_critical_path) == ("b", "implement", True)
    assert b.blame.execution_ids == ("x-bm", "x-bm2")
    by_exec = {c.execution_id: c for c in b.credit if c.kind == "execution"}
    for eid in ("x-bm", "x-bm2"):
        assert by_exec[eid].share < 0
        assert "on the critical path" in by_exec[eid].reason
        assert "responsible" in by_exec[eid].reason
    assert by_exec["x-d"].share > 0
    blocked = [c for c in b.credit if c.kind == "subtask"]
    assert [(c.subtask_id, c.stage) for c in blocked] == [("t", "verify")]
    assert "blocked" in blocked[0].reason
    stage = {c.stage: c for c in b.credit if c.kind == "stage"}
    assert "responsible" in stage["implement"].reason
    assert "responsible" not in stage["verify"].reason
    out = b.to_json_dict()["credit"]
    assert any(c["execution_id"] == "x-bm" and c["stage"] == "implement" for c in out)


def test_credit_prefers_the_critical_path_failure() -> None:
    t = ex.clean()
    t.completed = t.claimed_success = False
    del t.executions[-1]  # "t" cannot run
    t.executions[1].outcome = ex.F  # "a" (off the critical path) fails
    t.executions[4].outcome = ex.F  # "b#merge" (on it) fails
    b = score(t, CFG, 0)
    assert b.blame is not None and b.blame.subtask_id == "b"
    reasons = {c.execution_id: c.reason for c in b.credit if c.kind == "execution"}
    assert reasons["x-a"].startswith("failure off the critical path")
    assert "responsible" not in reasons["x-a"]
    t.executions[4].outcome = ex.S  # only the off-path failure left: it is to blame
    b = score(t, CFG, 0)
    assert b.blame is not None and (b.blame.subtask_id, b.blame.on_critical_path) == ("a", False)


def test_subtask_shares_split_completion_between_credit_and_blame() -> None:
    for build in ex.EXAMPLES.values():
        b = score(build(), CFG, 0)
        pos = math.fsum(
            c.share for c in b.credit if c.kind in ("execution", "subtask") and c.share > 0
        )
        neg = math.fsum(
            c.share for c in b.credit if c.kind in ("execution", "subtask") and c.share < 0
        )
        completion = b.raw["multi_objective.completion"]
        assert pos == pytest.approx(completion)
        assert neg == pytest.approx(-(1 - completion))


def test_penalties_are_charged_to_the_executions_that_hacked() -> None:
    b = score(ex.tool_abuse(), CFG, 0)
    charged = [c for c in b.credit if c.kind == "penalty"]
    assert [c.execution_id for c in charged] == ["x-a"]
    assert charged[0].share == pytest.approx(-b.penalties["tool_abuse"])


def test_successful_session_has_no_blame() -> None:
    assert score(ex.clean(), CFG, 0).blame is None


# --- purity, bad input, progress --------------------------------------------------------------


def test_score_is_deterministic_and_does_not_mutate_its_input() -> None:
    t = ex.failed_on_critical_path()
    before = t.SerializeToString(deterministic=True)
    a, b = score(t, CFG, 7.5), score(t, CFG, 7.5)
    assert a == b
    assert t.SerializeToString(deterministic=True) == before


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda t: setattr(t.executions[0], "end_time", float("nan")), "executions[0].end_time"),
        (lambda t: setattr(t.executions[2], "end_time", 1.0), "executions[2].end_time"),
        (lambda t: setattr(t, "latency", -1.0), "latency"),
        (lambda t: setattr(t, "test_coverage", 1.5), "test_coverage"),
        (lambda t: t.task.subtasks[0].deps.append("t"), "task.subtasks: dependency cycle"),
        (lambda t: t.task.subtasks[0].deps.append("zz"), "task.subtasks[0].deps"),
        (lambda t: setattr(t.task.subtasks[1], "id", "d"), "task.subtasks[1].id"),
    ],
)
def test_unscorable_trajectories_raise_naming_the_field(edit, field: str) -> None:
    t = ex.clean()
    edit(t)
    with pytest.raises(InvalidTrajectoryError) as info:
        score(t, CFG, 0)
    assert str(info.value).startswith(field), str(info.value)
    assert isinstance(info.value, ProcessingError) and not info.value.retriable


def test_negative_progress_is_rejected() -> None:
    with pytest.raises(InvalidTrajectoryError, match="progress"):
        score(ex.clean(), CFG, -1)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("12", 12.0),
        ("v12", 12.0),
        ("orchestrator:12", 12.0),
        ("cpls", 0.0),
        ("", 0.0),
        ("m2:v30", 30.0),
    ],
)
def test_progress_from_policy_version(version: str, expected: float) -> None:
    assert progress_from_policy_version(version, 1.0) == expected
    assert progress_from_policy_version(version, 2.5) == expected * 2.5
