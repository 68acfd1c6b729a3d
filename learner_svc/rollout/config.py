"""Settings of the rollout controller (``PODIUM_LEARNER_MODE=rollout``).

Every ``PODIUM_ROLLOUT_*`` rule setting maps 1:1 onto a field of
:class:`podium.rollout.RolloutSettings` (or its :class:`~podium.rollout.AdvantageRule` and
:class:`~podium.rollout.GuardrailConfig`), whose defaults are the production ones (a 72-hour
cycle, a week per stage, a 500-session shadow window); tests compress time by setting them.
The gRPC settings (tokens, TLS) are the orchestrator's, so one Secret serves both; so are the
statistics store's half-life and prior weight (``PODIUM_AGENT_STATS_*``), so one ConfigMap
gives the controller's store the orchestrators' settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from podium import topics
from podium.config import (
    env,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from podium.errors import ConfigError
from podium.observed import AgentStats
from podium.rollout import AdvantageRule, GuardrailConfig, RolloutSettings
from podium.service.auth import GrpcSecurityConfig

_RULE = RolloutSettings()
_SHADOW = AdvantageRule()
_GUARD = GuardrailConfig()
_STORE = AgentStats()

GROUP_PREFIX = "rollout"
"""The Kafka principal ``rollout`` may use only groups and transactional ids starting so."""


def stages(raw: str) -> tuple[int, ...]:
    """Comma-separated canary percents, increasing, each in (0, 100], the last 100."""
    try:
        values = tuple(int(p.strip()) for p in raw.split(",") if p.strip())
    except ValueError:
        raise ValueError("expected comma-separated integers, e.g. 1,5,20,100") from None
    if not values or values[-1] != 100 or any(not 0 < v <= 100 for v in values):
        raise ValueError("expected percents in (0, 100] ending with 100, e.g. 1,5,20,100")
    if list(values) != sorted(set(values)):
        raise ValueError("expected strictly increasing percents")
    return values


def rule_version(raw: str) -> str:
    """A rule-engine version string, ``rules:<name>``."""
    value = raw.strip()
    if not value.startswith("rules:") or not value[len("rules:") :]:
        raise ValueError("expected rules:<name>, e.g. rules:cpls")
    return value


RULE_FIELDS = {
    "RolloutSettings.": "PODIUM_ROLLOUT_",
    "AdvantageRule.": "PODIUM_ROLLOUT_SHADOW_",
    "GuardrailConfig.": "PODIUM_ROLLOUT_GUARDRAIL_",
}
"""How the rule classes' field names map onto the settings (1:1, by prefix)."""


STORE_FIELDS = {
    "half_life": "PODIUM_AGENT_STATS_HALF_LIFE",
    "prior_weight": "PODIUM_AGENT_STATS_PRIOR_WEIGHT",
}
"""The statistics store's constructor arguments -> the variables that set them."""


def settings_named(message: str) -> str:
    """``message`` of a rule class's ConfigError with each ``Class.field`` replaced by the
    variable that sets it (``AdvantageRule.window`` -> ``PODIUM_ROLLOUT_SHADOW_WINDOW``), and
    the statistics store's leading argument name likewise (``half_life`` ->
    ``PODIUM_AGENT_STATS_HALF_LIFE``)."""
    out = message
    for name, var in STORE_FIELDS.items():
        if out.startswith(f"{name} "):
            out = var + out[len(name) :]
    for cls, prefix in RULE_FIELDS.items():
        while cls in out:
            head, _, tail = out.partition(cls)
            name, sep, rest = tail.partition(":")
            out = f"{head}{prefix}{name.upper()}{sep}{rest}"
    return out


@dataclass(frozen=True)
class ControllerSettings(GrpcSecurityConfig):
    """The rollout controller's settings (the service-wide ones are in
    :class:`learner_svc.config.LearnerConfig`)."""

    stages: tuple[int, ...] = env("PODIUM_ROLLOUT_STAGES", default=_RULE.stages, parse=stages)
    """Canary percents of the staged rollout, in order (RolloutSettings.stages)."""
    baseline_bp: int = env(
        "PODIUM_ROLLOUT_BASELINE_BP", default=_RULE.baseline_bp, parse=positive_int
    )
    """Basis points of sessions kept on the previous version throughout, 500..1000."""
    stage_min_sessions: int = env(
        "PODIUM_ROLLOUT_STAGE_MIN_SESSIONS",
        default=_RULE.stage_min_sessions,
        parse=non_negative_int,
    )
    """Canary sessions a stage must see before it may advance."""
    stage_min_s: float = env(
        "PODIUM_ROLLOUT_STAGE_MIN_S", default=_RULE.stage_min_s, parse=non_negative_float
    )
    """Seconds a stage lasts at least (a week in production; tests use 0)."""
    review_sample_bp: int = env(
        "PODIUM_ROLLOUT_REVIEW_SAMPLE_BP", default=_RULE.review_sample_bp, parse=non_negative_int
    )
    """Basis points of canary sessions sampled for human review at the 20% stage."""
    cycle_s: float = env("PODIUM_ROLLOUT_CYCLE_S", default=_RULE.cycle_s, parse=positive_float)
    """Seconds between automatic proposals of the learner's newest version (72 h)."""
    offline_sessions: int = env(
        "PODIUM_ROLLOUT_OFFLINE_SESSIONS", default=_RULE.offline_sessions, parse=positive_int
    )
    """Recorded live sessions whose twins the offline check replays."""
    offline_tolerance: float = env(
        "PODIUM_ROLLOUT_OFFLINE_TOLERANCE",
        default=_RULE.offline_tolerance,
        parse=non_negative_float,
    )
    """The offline check passes when the paired mean return is >= -this."""
    cold_start: str = env("PODIUM_ROLLOUT_COLD_START", default=_RULE.cold_start, parse=rule_version)
    """The live version before any rollout: a rule engine (``rules:cpls``)."""
    shadow_window: int = env(
        "PODIUM_ROLLOUT_SHADOW_WINDOW", default=_SHADOW.window, parse=positive_int
    )
    """Consecutive shadow comparisons the candidate must keep its advantage over."""
    shadow_min_sessions: int = env(
        "PODIUM_ROLLOUT_SHADOW_MIN_SESSIONS", default=_SHADOW.min_sessions, parse=positive_int
    )
    """Comparisons before the running mean counts (AdvantageRule.min_sessions)."""
    shadow_alpha: float = env(
        "PODIUM_ROLLOUT_SHADOW_ALPHA", default=_SHADOW.alpha, parse=positive_float
    )
    """Level of the shadow's one-sided tests (AdvantageRule.alpha)."""
    shadow_max_sessions: int = env(
        "PODIUM_ROLLOUT_SHADOW_MAX_SESSIONS", default=_SHADOW.max_sessions, parse=positive_int
    )
    """Comparisons after which a candidate that has not passed shadow fails it."""
    guardrail_alpha: float = env(
        "PODIUM_ROLLOUT_GUARDRAIL_ALPHA", default=_GUARD.alpha, parse=positive_float
    )
    """Family-wise false-alarm rate of a stage's guardrails (GuardrailConfig.alpha)."""
    guardrail_min_sessions: int = env(
        "PODIUM_ROLLOUT_GUARDRAIL_MIN_SESSIONS", default=_GUARD.min_sessions, parse=positive_int
    )
    """Sessions per arm before any guardrail is tested (GuardrailConfig.min_sessions)."""
    group_id: str = env("PODIUM_ROLLOUT_GROUP", default=GROUP_PREFIX)
    """Consumer group on the scored trajectories, also the transactional-id prefix; must
    start with ``rollout`` (the Kafka principal's ACLs)."""
    topic: str = env("PODIUM_ROLLOUT_TOPIC", default=topics.ROLLOUT)
    """The rollout registry (compacted): state, transitions, checkpoint."""
    in_topic: str = env("PODIUM_ROLLOUT_IN_TOPIC", default=topics.SCORED_TRAJECTORIES)
    """Scored trajectories: shadow comparisons and guardrail readings."""
    trajectories_topic: str = env("PODIUM_ROLLOUT_TRAJECTORIES_TOPIC", default=topics.TRAJECTORIES)
    """Recorded sessions the offline check replays (the newest ones)."""
    policy_topic: str = env("PODIUM_ROLLOUT_POLICY_TOPIC", default=topics.POLICY_UPDATES)
    """Announced versions: the candidates."""
    tick_s: float = env("PODIUM_ROLLOUT_TICK_S", default=1.0, parse=positive_float)
    """Longest wait for scored trajectories before timers (cycle, stage period) are checked."""
    twin_batch: int = env("PODIUM_ROLLOUT_TWIN_BATCH", default=32, parse=positive_int)
    """Twin sessions simulated in lock-step per batch."""
    grpc_host: str = env("PODIUM_ROLLOUT_GRPC_HOST", default="0.0.0.0")
    """Address RolloutService listens on."""
    grpc_port: int = env("PODIUM_ROLLOUT_GRPC_PORT", default=50061, parse=port)
    """Port of RolloutService (0 = a free one)."""
    trusted_keys: str = env("PODIUM_POLICY_TRUSTED_KEYS", default="")
    """Public keys whose signed announcements may become candidates (comma-separated PEM
    files or directories); empty = only rule versions can be candidates."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Pool spec twins simulate (the orchestrator's); empty = the shipped default."""
    agent_stats: bool = env("PODIUM_ROLLOUT_AGENT_STATS", default=True)
    """Keep a statistics store of the sub-agents (:class:`podium.observed.AgentStats`), fed
    once by every scored trajectory absorbed and checkpointed with the evidence; twins then
    simulate the sub-agents as observed (the store's estimated pool) and every policy reads
    it. ``off``: twins simulate the pool spec (its ``true:`` profiles if it carries any)."""
    agent_stats_half_life: float = env(
        "PODIUM_AGENT_STATS_HALF_LIFE", default=_STORE.half_life, parse=positive_float
    )
    """Statistics store: executions of one (agent, kind) after which an observation weighs
    half (the orchestrator's setting of the same name)."""
    agent_stats_prior_weight: float = env(
        "PODIUM_AGENT_STATS_PRIOR_WEIGHT", default=_STORE.prior_weight, parse=positive_float
    )
    """Statistics store: how many executions an advertised profile is worth (the
    orchestrator's setting of the same name)."""

    def __post_init__(self) -> None:
        if not self.group_id.startswith(GROUP_PREFIX):
            raise ConfigError(
                f"PODIUM_ROLLOUT_GROUP={self.group_id!r} must start with {GROUP_PREFIX!r} "
                "(the rollout principal's ACLs)"
            )
        try:
            self.rollout_settings()
            self.new_agent_stats()  # checked even when off: a bad value is a bad value
        except ConfigError as exc:  # the rules' own checks, said in the settings' names
            raise ConfigError(settings_named(str(exc))) from exc

    def new_agent_stats(self) -> AgentStats:
        """An empty statistics store with these settings (validated there)."""
        return AgentStats(
            half_life=self.agent_stats_half_life, prior_weight=self.agent_stats_prior_weight
        )

    def rollout_settings(self) -> RolloutSettings:
        """The state machine's rules these settings give (validated there)."""
        return RolloutSettings(
            stages=self.stages,
            baseline_bp=self.baseline_bp,
            stage_min_sessions=self.stage_min_sessions,
            stage_min_s=self.stage_min_s,
            review_sample_bp=self.review_sample_bp,
            cycle_s=self.cycle_s,
            offline_sessions=self.offline_sessions,
            offline_tolerance=self.offline_tolerance,
            cold_start=self.cold_start,
            advantage=AdvantageRule(
                window=self.shadow_window,
                min_sessions=self.shadow_min_sessions,
                alpha=self.shadow_alpha,
                max_sessions=self.shadow_max_sessions,
            ),
            guardrails=GuardrailConfig(
                alpha=self.guardrail_alpha, min_sessions=self.guardrail_min_sessions
            ),
        )
