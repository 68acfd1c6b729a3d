"""Reward config: YAML loading, field-naming validation, versioning, schedules."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest
import yaml

from podium.context.questions import GoldSpan
from podium.errors import ConfigError
from podium.rewards import default_config, load_config, score
from podium.rewards.config import ContextRewardConfig, RewardConfig, config_from_mapping
from podium.rewards.context import ContextEpisode, ContextStep, episode_trajectory
from podium.rewards.schedules import cosine_anneal, linear_anneal, schedule_value
from podium.v1 import trajectory_pb2

DATA = Path(__file__).parents[3] / "podium" / "data" / "rewards"


def _default_mapping() -> dict:
    return yaml.safe_load((DATA / "default.yaml").read_text())


def test_default_config_has_the_published_weights() -> None:
    c = default_config()
    assert (c.multi_stage.design, c.multi_stage.implement, c.multi_stage.verify) == (0.2, 0.5, 0.3)
    mo = c.multi_objective
    assert (mo.completion.start, mo.efficiency.start, mo.efficiency.end, mo.quality.start) == (
        0.4,
        0.3,
        0.05,
        0.3,
    )
    assert c.parl.lambda1.end == 0.0 and c.parl.lambda2.end == 0.0


@pytest.mark.parametrize("path", sorted(DATA.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    c = load_config(path)
    assert c.version.startswith(f"r1-{c.name}-")


def test_config_is_frozen() -> None:
    c = default_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.mix.parl = 1.0  # type: ignore[misc]


def test_version_changes_with_any_value_and_is_stable_otherwise() -> None:
    a = config_from_mapping(_default_mapping())
    b = config_from_mapping(_default_mapping())
    assert a.version == b.version
    changed = _default_mapping()
    changed["detectors"]["trivial_tests"]["threshold"] = 0.7
    assert config_from_mapping(changed).version != a.version


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (
            lambda m: m["detectors"]["trivial_tests"].update(treshold=0.5),
            "detectors.trivial_tests.treshold",
        ),
        (lambda m: m["mix"].update(parl="lots"), "mix.parl"),
        (lambda m: m["parl"]["lambda1"].update(kind="exponential"), "parl.lambda1.kind"),
        (lambda m: m["parl"]["lambda2"].update(updates=0), "parl.lambda2.updates"),
        (
            lambda m: m["detectors"]["trivial_tests"].update(threshold=1.5),
            "detectors.trivial_tests.threshold",
        ),
        (
            lambda m: m["detectors"]["tool_abuse"].update(budget_per_execution=1.5),
            "detectors.tool_abuse.budget_per_execution",
        ),
        (
            lambda m: m["multi_objective"]["efficiency"].update(end=-0.1),
            "multi_objective.efficiency.end",
        ),
        (lambda m: m["multi_stage"].update(verify_kinds="test"), "multi_stage.verify_kinds"),
        (lambda m: m["detectors"].update(fake_parallelism=[1]), "detectors.fake_parallelism"),
        (lambda m: m["mix"].update(parl=0, multi_objective=0, multi_stage=0), "mix"),
        (lambda m: m["mix"].update(parl=float("nan")), "mix.parl"),
        (lambda m: m["context"].update(fuond=1.0), "context.fuond"),
        (lambda m: m["context"]["hoarding"].update(wieght=0.1), "context.hoarding.wieght"),
        (lambda m: m["context"].update(turn=-0.1), "context.turn"),
        (lambda m: m["context"].update(found="yes"), "context.found"),
        (lambda m: m["context"]["gold_pruning"].update(scale=0), "context.gold_pruning.scale"),
        (lambda m: m["context"]["hoarding"].update(keep_ratio=1.5), "context.hoarding.keep_ratio"),
    ],
)
def test_invalid_values_are_rejected_naming_the_field(edit, field: str) -> None:
    m = _default_mapping()
    edit(m)
    with pytest.raises(ConfigError) as info:
        config_from_mapping(m)
    assert str(info.value).startswith(f"{field}:"), str(info.value)


def test_load_config_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "r.yaml"
    bad.write_text("mix: {parl: 1, surprise: 2}\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: mix\.surprise: unknown field"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("mix: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(tmp_path / "broken.yaml")


def test_empty_file_means_all_defaults() -> None:
    assert config_from_mapping(None) == RewardConfig()


def test_linear_and_cosine_anneal_endpoints_and_midpoint() -> None:
    assert linear_anneal(0.3, 0.05, 0.0) == 0.3
    assert math.isclose(linear_anneal(0.3, 0.05, 1.0), 0.05)
    assert math.isclose(linear_anneal(0.3, 0.05, 0.5), 0.175)
    assert cosine_anneal(0.1, 0.0, 0.0) == 0.1
    assert math.isclose(cosine_anneal(0.1, 0.0, 1.0), 0.0, abs_tol=1e-15)
    assert math.isclose(cosine_anneal(0.1, 0.0, 0.5), 0.05)
    # Cosine stays above linear in the first half (slow start), below in the second.
    assert cosine_anneal(1.0, 0.0, 0.25) > linear_anneal(1.0, 0.0, 0.25)
    assert cosine_anneal(1.0, 0.0, 0.75) < linear_anneal(1.0, 0.0, 0.75)


def test_schedules_hold_their_end_value_after_the_configured_updates() -> None:
    c = default_config()
    eff = c.multi_objective.efficiency
    assert schedule_value(eff, 0) == 0.3
    assert math.isclose(schedule_value(eff, eff.updates), 0.05)
    assert math.isclose(schedule_value(eff, 10 * eff.updates), 0.05)
    lam = c.parl.lambda1
    values = [schedule_value(lam, p) for p in range(0, lam.updates + 1, 50)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert values[-1] == pytest.approx(0.0, abs=1e-12)


def _context_trajectory() -> trajectory_pb2.Trajectory:
    """A context episode that keeps one gold and one other chunk after searching twice alike."""
    gold = GoldSpan("gold.txt", 0, 100)
    steps = (
        ContextStep("search", retriever="bm25", form="question", query="open flags"),
        ContextStep("search", retriever="bm25", form="question", query="Open  flags"),
        ContextStep("keep", chunk_id="c1", source="gold.txt", start=0, end=100, tokens=100),
        ContextStep("keep", chunk_id="c2", source="other.txt", start=0, end=100, tokens=100),
        ContextStep("finish"),
    )
    return episode_trajectory(ContextEpisode("q", 1000, steps, (gold,)), trajectory_id="t")


def test_the_context_section_sets_the_context_reward(tmp_path: Path) -> None:
    traj = _context_trajectory()
    default = default_config()
    assert default.context == ContextRewardConfig()  # the shipped YAML states the defaults
    before = score(traj, default, 0.0)
    assert before.components["context.precision"] == pytest.approx(0.25 * 0.5)

    mapping = _default_mapping()
    mapping["context"]["precision"] = 1.0
    mapping["context"]["search_loop"]["weight"] = 0.9
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(mapping))
    config = load_config(path)
    after = score(traj, config, 0.0)
    assert after.components["context.precision"] == pytest.approx(1.0 * 0.5)
    loop = 1.0 - math.exp(-1 / 2.0)  # one repeated search (case and spacing do not count)
    assert before.penalties["search_loop"] == pytest.approx(0.3 * loop)
    assert after.penalties["search_loop"] == pytest.approx(0.9 * loop)
    assert after.total == pytest.approx(before.total + 0.375 - 0.6 * loop)
    # The context digest changes, the swarm part of the version does not.
    assert config.version == default.version
    assert after.reward_version != before.reward_version
    assert after.reward_version.startswith(f"{default.version}+ctx")
