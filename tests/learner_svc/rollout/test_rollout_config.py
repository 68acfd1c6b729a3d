"""``PODIUM_ROLLOUT_*`` settings: production defaults, a 1:1 mapping onto the rules, and bad
values refused naming the variable."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from learner_svc.config import LearnerConfig
from learner_svc.rollout.config import ControllerSettings
from podium.config import from_env
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.rollout import AdvantageRule, GuardrailConfig, RolloutSettings

ROOT = Path(__file__).resolve().parents[3]

EVERY = {
    "PODIUM_ROLLOUT_STAGES": "2,10,50,100",
    "PODIUM_ROLLOUT_BASELINE_BP": "800",
    "PODIUM_ROLLOUT_STAGE_MIN_SESSIONS": "7",
    "PODIUM_ROLLOUT_STAGE_MIN_S": "3.5",
    "PODIUM_ROLLOUT_REVIEW_SAMPLE_BP": "250",
    "PODIUM_ROLLOUT_CYCLE_S": "60",
    "PODIUM_ROLLOUT_OFFLINE_SESSIONS": "9",
    "PODIUM_ROLLOUT_OFFLINE_TOLERANCE": "0.25",
    "PODIUM_ROLLOUT_COLD_START": "rules:greedy",
    "PODIUM_ROLLOUT_SHADOW_WINDOW": "40",
    "PODIUM_ROLLOUT_SHADOW_MIN_SESSIONS": "8",
    "PODIUM_ROLLOUT_SHADOW_ALPHA": "0.1",
    "PODIUM_ROLLOUT_SHADOW_MAX_SESSIONS": "900",
    "PODIUM_ROLLOUT_GUARDRAIL_ALPHA": "0.01",
    "PODIUM_ROLLOUT_GUARDRAIL_MIN_SESSIONS": "12",
}


def test_defaults_are_the_production_rules() -> None:
    s = from_env(ControllerSettings, {})
    assert s.rollout_settings() == RolloutSettings()
    assert s.rollout_settings().cycle_s == 72 * 3600
    assert s.group_id == "rollout"


def test_every_rule_setting_maps_one_to_one() -> None:
    rules = from_env(ControllerSettings, EVERY).rollout_settings()
    assert rules == RolloutSettings(
        stages=(2, 10, 50, 100),
        baseline_bp=800,
        stage_min_sessions=7,
        stage_min_s=3.5,
        review_sample_bp=250,
        cycle_s=60.0,
        offline_sessions=9,
        offline_tolerance=0.25,
        cold_start="rules:greedy",
        advantage=AdvantageRule(window=40, min_sessions=8, alpha=0.1, max_sessions=900),
        guardrails=GuardrailConfig(alpha=0.01, min_sessions=12),
    )
    rule_fields = (
        len(dataclasses.fields(RolloutSettings)) - 2 + 4 + 2  # advantage: 4, guardrails: 2
    )
    assert len(EVERY) == rule_fields


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("PODIUM_ROLLOUT_STAGES", "1,5,20"),
        ("PODIUM_ROLLOUT_STAGES", "5,1,100"),
        ("PODIUM_ROLLOUT_BASELINE_BP", "100"),
        ("PODIUM_ROLLOUT_BASELINE_BP", "lots"),
        ("PODIUM_ROLLOUT_COLD_START", "cpls"),
        ("PODIUM_ROLLOUT_SHADOW_WINDOW", "3"),
        ("PODIUM_ROLLOUT_SHADOW_ALPHA", "2"),
        ("PODIUM_ROLLOUT_OFFLINE_SESSIONS", "0"),
        ("PODIUM_ROLLOUT_GROUP", "learner"),
        ("PODIUM_ROLLOUT_GRPC_PORT", "70000"),
        ("PODIUM_ROLLOUT_AGENT_STATS", "maybe"),
        ("PODIUM_AGENT_STATS_HALF_LIFE", "0"),
        ("PODIUM_AGENT_STATS_PRIOR_WEIGHT", "-1"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        from_env(ControllerSettings, {var: value})


def test_the_statistics_store_settings_are_the_orchestrators() -> None:
    s = from_env(ControllerSettings, {})
    store = s.new_agent_stats()
    default = AgentStats()
    assert s.agent_stats and (store.half_life, store.prior_weight) == (
        default.half_life,
        default.prior_weight,
    )
    set_ = from_env(
        ControllerSettings,
        {
            "PODIUM_ROLLOUT_AGENT_STATS": "off",
            "PODIUM_AGENT_STATS_HALF_LIFE": "50",
            "PODIUM_AGENT_STATS_PRIOR_WEIGHT": "2.5",
        },
    )
    assert not set_.agent_stats
    assert (set_.new_agent_stats().half_life, set_.new_agent_stats().prior_weight) == (50.0, 2.5)
    # Built in code (no parse function runs): still refused, naming the variable.
    with pytest.raises(ConfigError, match="PODIUM_AGENT_STATS_HALF_LIFE must be a finite"):
        ControllerSettings(agent_stats_half_life=float("nan"))
    with pytest.raises(ConfigError, match="PODIUM_AGENT_STATS_PRIOR_WEIGHT must be a finite"):
        ControllerSettings(agent_stats=False, agent_stats_prior_weight=0.0)


def test_rollout_is_a_learner_mode() -> None:
    assert from_env(
        LearnerConfig, {"PODIUM_BUS": "kafka://127.0.0.1:9092", "PODIUM_LEARNER_MODE": "rollout"}
    )


def test_every_setting_is_documented() -> None:
    text = (ROOT / "docs" / "services.md").read_text()
    fields = dataclasses.fields(ControllerSettings)
    names = {str(f.metadata["env"]) for f in fields if "env" in f.metadata}
    missing = sorted(n for n in names if n.startswith("PODIUM_ROLLOUT") and n not in text)
    assert not missing, f"docs/services.md does not document {missing}"
    assert re.search(r"PODIUM_LEARNER_MODE.*rollout", text)
