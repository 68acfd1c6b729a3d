"""Safe shipping, the decisions: which arm serves a session, when a candidate has earned more
traffic, when a canary must roll back, and the state machine that records each step.

Pure functions and small classes with no I/O: the rollout controller feeds them events and
writes what they return; orchestrator replicas route with :func:`route`. Twins (simulated replays of sessions, which need torch) live in
:mod:`podium.rollout.twins` and are not re-exported here.
"""

from podium.rollout.machine import (
    STAGES,
    RolloutSettings,
    advance,
    can_advance,
    claim,
    initial_state,
    offline_checked,
    pause,
    propose,
    resume,
    rollback,
    shadow_done,
    stage_name,
)
from podium.rollout.metrics import LATENCY_RATIO_CAP, session_metrics
from podium.rollout.routing import BUCKETS, Route, bucket, role_name, route, target_shares
from podium.rollout.stats import (
    DEFAULT_GUARDRAILS,
    AdvantageRule,
    AdvantageWindow,
    Guardrail,
    GuardrailConfig,
    GuardrailMonitor,
    Moments,
    Verdict,
    msprt_log_lr,
)

__all__ = [
    "BUCKETS",
    "DEFAULT_GUARDRAILS",
    "LATENCY_RATIO_CAP",
    "STAGES",
    "AdvantageRule",
    "AdvantageWindow",
    "Guardrail",
    "GuardrailConfig",
    "GuardrailMonitor",
    "Moments",
    "RolloutSettings",
    "Route",
    "Verdict",
    "advance",
    "bucket",
    "can_advance",
    "claim",
    "initial_state",
    "msprt_log_lr",
    "offline_checked",
    "pause",
    "propose",
    "resume",
    "role_name",
    "rollback",
    "route",
    "session_metrics",
    "shadow_done",
    "stage_name",
    "target_shares",
]
