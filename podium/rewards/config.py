"""Reward configuration: a typed, frozen view of a YAML file, validated field by field.

Every number the reward uses (form mix, component weights, annealing schedules, detector
thresholds and penalty weights) lives here, so changing the reward is a config change with a
new ``reward_version``, never a code edit. :func:`config_from_mapping` rejects unknown keys and
bad values with a :class:`~podium.errors.ConfigError` whose message names the dotted field
(``detectors.trivial_tests.threshold``), so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, cast, get_args

import yaml

from podium.errors import ConfigError

REWARD_CODE_VERSION = "1"
"""Version of the scoring code. Bump it whenever a formula changes, so every score produced by
the new code carries a new ``reward_version`` even with an unchanged config file."""

ScheduleKind = Literal["constant", "linear", "cosine"]
STAGES: tuple[str, ...] = ("design", "implement", "verify")
"""The work stages of the multi-stage reward, in pipeline order."""
FORMS: tuple[str, ...] = ("parl", "multi_objective", "multi_stage")
"""The reward forms that can be mixed into the total."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A weight that moves from ``start`` to ``end`` over ``updates`` learner updates."""

    kind: ScheduleKind = "constant"
    """``constant`` (always ``start``), ``linear`` or ``cosine`` annealing."""
    start: float = 0.0
    """Value at progress 0."""
    end: float = 0.0
    """Value once ``updates`` updates are done (ignored by ``constant``)."""
    updates: int = 1
    """Number of learner updates the annealing spans (> 0)."""


@dataclass(frozen=True, slots=True)
class MixConfig:
    """Weight of each reward form in the total (a form with weight 0 is not computed)."""

    parl: float = 0.0
    """PARL: λ1·r_parallel + λ2·r_finish + r_perf."""
    multi_objective: float = 1.0
    """Completion / efficiency / quality."""
    multi_stage: float = 0.0
    """Design / implement / verify."""


@dataclass(frozen=True, slots=True)
class ParlConfig:
    """PARL (Kimi K2.5): auxiliary rewards annealed to zero so only r_perf remains."""

    lambda1: Schedule = Schedule("cosine", 0.1, 0.0, 1000)
    """λ1, weight of r_parallel (counters serial collapse)."""
    lambda2: Schedule = Schedule("cosine", 0.1, 0.0, 1000)
    """λ2, weight of r_finish (counters spurious parallelism)."""
    perf: float = 1.0
    """Weight of r_perf, the task outcome (1 in the paper)."""


@dataclass(frozen=True, slots=True)
class MultiObjectiveConfig:
    """Completion 0.4, efficiency 0.3 annealed to 0.05, quality 0.3 by default."""

    completion: Schedule = Schedule("constant", 0.4)
    """Weight of the fraction of required subtasks completed."""
    efficiency: Schedule = Schedule("linear", 0.3, 0.05, 1000)
    """Weight of lower_bound / latency (scaled by completion)."""
    quality: Schedule = Schedule("constant", 0.3)
    """Weight of the fraction of required subtasks completed with a verified result."""


@dataclass(frozen=True, slots=True)
class MultiStageConfig:
    """Design / implement / verify at 0.2 / 0.5 / 0.3 by default."""

    design: float = 0.2
    """Weight of the design stage."""
    implement: float = 0.5
    """Weight of the implement stage."""
    verify: float = 0.3
    """Weight of the verify stage."""
    design_kinds: tuple[str, ...] = ("design", "spec", "plan", "architecture")
    """Subtask kinds counted as design when an execution carries no stage tag."""
    verify_kinds: tuple[str, ...] = ("test", "verify", "review", "qa")
    """Subtask kinds counted as verify when an execution carries no stage tag."""


@dataclass(frozen=True, slots=True)
class FakeParallelismConfig:
    """Sub-agents spawned but run serially (split chunks that never overlap) or idle."""

    weight: float = 0.5
    """Penalty at 100% fake executions; the penalty is weight × fake fraction."""
    min_overlap_ratio: float = 0.1
    """A split's chunks count as parallel when Σ durations / span ≥ 1 + this."""
    min_duration: float = 1e-6
    """An execution shorter than this with no tool calls did nothing."""


@dataclass(frozen=True, slots=True)
class ToolAbuseConfig:
    """Repeated identical or trivial tool calls beyond a per-execution budget."""

    weight: float = 0.3
    """Penalty as the excess grows without bound."""
    budget_per_execution: int = 2
    """Redundant or trivial calls an execution may make for free."""
    scale: float = 5.0
    """Excess calls at which the penalty reaches 1 − 1/e of the weight."""
    trivial_tools: tuple[str, ...] = ("noop", "sleep", "echo", "pwd", "ping")
    """Tool names that never do task work."""


@dataclass(frozen=True, slots=True)
class FabricatedResultConfig:
    """Success claimed without a verifying result behind it."""

    session_weight: float = 1.0
    """Penalty when the session claims success but not every required subtask succeeded."""
    subtask_weight: float = 0.5
    """Penalty at 100% unverified successes; the penalty is weight × unverified fraction."""
    max_unverified_fraction: float = 0.0
    """Unverified successes tolerated before the subtask part applies."""


@dataclass(frozen=True, slots=True)
class TrivialTestsConfig:
    """Test coverage below a threshold; the penalty grows exponentially as coverage falls."""

    weight: float = 0.5
    """Penalty at coverage 0."""
    threshold: float = 0.6
    """Coverage at or above which there is no penalty, in (0, 1]."""
    steepness: float = 5.0
    """k in (exp(k·(threshold − c)) − 1) / (exp(k·threshold) − 1); > 0."""


@dataclass(frozen=True, slots=True)
class BrokenToolCallsConfig:
    """Malformed tool calls and executions with malformed output are penalised, never dropped."""

    per_call: float = 0.05
    """Penalty per malformed tool call."""
    per_execution: float = 0.1
    """Penalty per execution whose outcome is MALFORMED."""
    cap: float = 1.0
    """Largest total penalty of this detector."""


@dataclass(frozen=True, slots=True)
class AvoidanceConfig:
    """Finishing without attempting required subtasks."""

    weight: float = 1.0
    """Penalty when nothing is attempted; the penalty is weight × unattempted fraction."""
    max_unattempted_fraction: float = 0.0
    """Unattempted fraction tolerated before the penalty applies."""


@dataclass(frozen=True, slots=True)
class DetectorsConfig:
    """The six anti-hacking detectors."""

    fake_parallelism: FakeParallelismConfig = FakeParallelismConfig()
    """Fake parallelism."""
    tool_abuse: ToolAbuseConfig = ToolAbuseConfig()
    """Tool abuse."""
    fabricated_result: FabricatedResultConfig = FabricatedResultConfig()
    """Fabricated result."""
    trivial_tests: TrivialTestsConfig = TrivialTestsConfig()
    """Trivial tests."""
    broken_tool_calls: BrokenToolCallsConfig = BrokenToolCallsConfig()
    """Broken tool calls."""
    avoidance: AvoidanceConfig = AvoidanceConfig()
    """Avoidance."""


CONTEXT_WEIGHTS: tuple[str, ...] = ("found", "precision", "tokens", "turn", "invalid")
"""The Context-1 shape's weights, in the order of its formula."""


@dataclass(frozen=True, slots=True)
class HoardingConfig:
    """Keeping (nearly) everything looked at until the budget is full."""

    weight: float = 0.3
    """Penalty when every decided candidate was kept and the budget is full."""
    min_fill: float = 0.9
    """Fraction of the budget the kept context must fill for the detector to apply."""
    keep_ratio: float = 0.9
    """Kept / (kept + pruned) at or above which keeping counts as indiscriminate."""
    min_decisions: int = 3
    """Keep/prune decisions needed before a ratio means anything."""


@dataclass(frozen=True, slots=True)
class GoldPruningConfig:
    """Streaks of prunes that throw gold chunks away."""

    weight: float = 0.5
    """Penalty as the gold thrown away grows without bound."""
    streak: int = 3
    """Consecutive prunes that make a streak."""
    scale: float = 1.0
    """Gold chunks pruned in streaks at which the penalty reaches 1 − 1/e of the weight."""


@dataclass(frozen=True, slots=True)
class SearchLoopConfig:
    """Repeated identical searches."""

    weight: float = 0.3
    """Penalty as the repeats grow without bound."""
    free_repeats: int = 0
    """Identical searches an episode may repeat for free."""
    scale: float = 2.0
    """Repeats over the free ones at which the penalty reaches 1 − 1/e of the weight."""


@dataclass(frozen=True, slots=True)
class ContextRewardConfig:
    """The ``context:`` section: weights of the Context-1 reward shape and its detectors, for
    trajectories with ``env == "context"`` (:mod:`podium.rewards.context`)."""

    found: float = 1.0
    """Reward for a kept context holding a gold span."""
    precision: float = 0.25
    """Weight of the kept chunks' precision."""
    tokens: float = 0.2
    """Penalty for a kept context as large as the budget (proportional below it)."""
    turn: float = 0.005
    """Penalty per step (a turn is latency)."""
    invalid: float = 0.05
    """Penalty per action the state did not allow."""
    hoarding: HoardingConfig = HoardingConfig()
    """The ``context_hoarding`` detector."""
    gold_pruning: GoldPruningConfig = GoldPruningConfig()
    """The ``gold_pruning`` detector."""
    search_loop: SearchLoopConfig = SearchLoopConfig()
    """The ``search_loop`` detector."""

    def __post_init__(self) -> None:
        # Checked here, not in _validate: the environment builds this config directly too.
        h, g, s = self.hoarding, self.gold_pruning, self.search_loop
        rules: list[tuple[str, float, bool, str]] = [
            *((n, getattr(self, n), getattr(self, n) >= 0, ">= 0") for n in CONTEXT_WEIGHTS),
            ("hoarding.weight", h.weight, h.weight >= 0, ">= 0"),
            ("hoarding.min_fill", h.min_fill, h.min_fill >= 0, ">= 0"),
            ("hoarding.keep_ratio", h.keep_ratio, 0 <= h.keep_ratio <= 1, "in [0, 1]"),
            ("hoarding.min_decisions", h.min_decisions, h.min_decisions >= 0, ">= 0"),
            ("gold_pruning.weight", g.weight, g.weight >= 0, ">= 0"),
            ("gold_pruning.streak", g.streak, g.streak >= 1, ">= 1"),
            ("gold_pruning.scale", g.scale, g.scale > 0, "> 0"),
            ("search_loop.weight", s.weight, s.weight >= 0, ">= 0"),
            ("search_loop.free_repeats", s.free_repeats, s.free_repeats >= 0, ">= 0"),
            ("search_loop.scale", s.scale, s.scale > 0, "> 0"),
        ]
        for name, value, ok, rule in rules:
            if not (math.isfinite(value) and ok):
                raise ConfigError(f"context.{name}: must be a finite number {rule}, got {value}")


@dataclass(frozen=True, slots=True)
class RewardConfig:
    """Everything :func:`podium.rewards.score` needs besides the trajectory and the progress."""

    name: str = "default"
    """Human-readable name of this reward configuration."""
    mix: MixConfig = MixConfig()
    """Weight of each reward form in the total."""
    parl: ParlConfig = ParlConfig()
    """PARL form."""
    multi_objective: MultiObjectiveConfig = MultiObjectiveConfig()
    """Multi-objective form."""
    multi_stage: MultiStageConfig = MultiStageConfig()
    """Multi-stage form."""
    detectors: DetectorsConfig = DetectorsConfig()
    """Anti-hacking detectors."""
    context: ContextRewardConfig = ContextRewardConfig()
    """The context environment's reward (``env == "context"`` trajectories); versioned on its
    own (:func:`podium.rewards.context.context_reward_version`), not in :func:`reward_version`."""
    progress_per_policy_version: float = 1.0
    """Learner updates per policy version, used by the service to turn the acting policy's
    version into training progress (so a re-score reproduces the same annealing)."""
    version: str = field(default="", compare=False)
    """``REWARD_CODE_VERSION`` plus a hash of every other field; filled in on load."""


def reward_version(config: RewardConfig) -> str:
    """Version string of ``config``: code version + sha256 of its canonical JSON form, the
    ``context`` section left out: context scores append their own digest of it, so changing
    a context weight leaves the swarm's scores' version as it was."""
    body = dataclasses.asdict(config)
    body.pop("version", None)
    body.pop("context", None)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    return f"r{REWARD_CODE_VERSION}-{config.name}-{digest}"


T = TypeVar("T")


def _build(cls: type[T], data: Any, where: str) -> T:
    """Build dataclass ``cls`` from ``data``, naming ``where.field`` in every error."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cast(Any, cls)) if f.name != "version"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{_join(where, str(unknown[0]))}: unknown field (known: {known})")
    kwargs: dict[str, Any] = {}
    hints = {f.name: f.type for f in dataclasses.fields(cast(Any, cls))}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, _join(where, name))
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - guarded by the unknown-field check
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


_NESTED: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        Schedule,
        MixConfig,
        ParlConfig,
        MultiObjectiveConfig,
        MultiStageConfig,
        FakeParallelismConfig,
        ToolAbuseConfig,
        FabricatedResultConfig,
        TrivialTestsConfig,
        BrokenToolCallsConfig,
        AvoidanceConfig,
        DetectorsConfig,
        HoardingConfig,
        GoldPruningConfig,
        SearchLoopConfig,
        ContextRewardConfig,
    )
}


def _convert(hint: Any, value: Any, where: str) -> Any:
    """Check and convert one YAML value against the field's annotation (a string here)."""
    hint = str(hint)
    if hint in _NESTED:
        return _build(_NESTED[hint], value, where)
    if hint == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: must be finite, got {value!r}")
        return float(value)
    if hint == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if hint == "tuple[str, ...]":
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(value)
    if hint == "ScheduleKind":
        kinds = get_args(ScheduleKind)
        if value not in kinds:
            raise ConfigError(f"{where}: expected one of {', '.join(kinds)}, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint}")  # pragma: no cover


def _validate(config: RewardConfig) -> None:
    """Range checks that the types alone cannot express; errors name the field."""

    def non_negative(where: str, value: float) -> None:
        if value < 0:
            raise ConfigError(f"{where}: must be >= 0, got {value}")

    def schedule(where: str, s: Schedule) -> None:
        non_negative(f"{where}.start", s.start)
        non_negative(f"{where}.end", s.end)
        if s.updates <= 0:
            raise ConfigError(f"{where}.updates: must be > 0, got {s.updates}")

    for form in FORMS:
        non_negative(f"mix.{form}", getattr(config.mix, form))
    if sum(getattr(config.mix, form) for form in FORMS) <= 0:
        raise ConfigError("mix: at least one reward form needs a positive weight")
    schedule("parl.lambda1", config.parl.lambda1)
    schedule("parl.lambda2", config.parl.lambda2)
    non_negative("parl.perf", config.parl.perf)
    for part in ("completion", "efficiency", "quality"):
        schedule(f"multi_objective.{part}", getattr(config.multi_objective, part))
    for stage in STAGES:
        non_negative(f"multi_stage.{stage}", getattr(config.multi_stage, stage))
    if config.mix.multi_stage > 0 and sum(getattr(config.multi_stage, s) for s in STAGES) <= 0:
        raise ConfigError("multi_stage: at least one stage needs a positive weight")
    d = config.detectors
    non_negative("detectors.fake_parallelism.weight", d.fake_parallelism.weight)
    non_negative(
        "detectors.fake_parallelism.min_overlap_ratio", d.fake_parallelism.min_overlap_ratio
    )
    non_negative("detectors.fake_parallelism.min_duration", d.fake_parallelism.min_duration)
    non_negative("detectors.tool_abuse.weight", d.tool_abuse.weight)
    if d.tool_abuse.budget_per_execution < 0:
        raise ConfigError("detectors.tool_abuse.budget_per_execution: must be >= 0")
    if d.tool_abuse.scale <= 0:
        raise ConfigError(f"detectors.tool_abuse.scale: must be > 0, got {d.tool_abuse.scale}")
    non_negative("detectors.fabricated_result.session_weight", d.fabricated_result.session_weight)
    non_negative("detectors.fabricated_result.subtask_weight", d.fabricated_result.subtask_weight)
    frac = d.fabricated_result.max_unverified_fraction
    if not 0 <= frac <= 1:
        raise ConfigError(
            f"detectors.fabricated_result.max_unverified_fraction: must be in [0, 1], got {frac}"
        )
    non_negative("detectors.trivial_tests.weight", d.trivial_tests.weight)
    if not 0 < d.trivial_tests.threshold <= 1:
        raise ConfigError(
            f"detectors.trivial_tests.threshold: must be in (0, 1], got {d.trivial_tests.threshold}"
        )
    if d.trivial_tests.steepness <= 0:
        raise ConfigError(
            f"detectors.trivial_tests.steepness: must be > 0, got {d.trivial_tests.steepness}"
        )
    non_negative("detectors.broken_tool_calls.per_call", d.broken_tool_calls.per_call)
    non_negative("detectors.broken_tool_calls.per_execution", d.broken_tool_calls.per_execution)
    non_negative("detectors.broken_tool_calls.cap", d.broken_tool_calls.cap)
    non_negative("detectors.avoidance.weight", d.avoidance.weight)
    frac = d.avoidance.max_unattempted_fraction
    if not 0 <= frac <= 1:
        raise ConfigError(
            f"detectors.avoidance.max_unattempted_fraction: must be in [0, 1], got {frac}"
        )
    if config.progress_per_policy_version < 0:
        raise ConfigError("progress_per_policy_version: must be >= 0")


def config_from_mapping(data: Any) -> RewardConfig:
    """Validate a parsed YAML/JSON mapping into a :class:`RewardConfig` (with its version)."""
    config = _build(RewardConfig, data, "")
    _validate(config)
    return dataclasses.replace(config, version=reward_version(config))


def load_config(path: str | Path) -> RewardConfig:
    """Read and validate a reward config YAML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"reward config {p}: cannot read ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"reward config {p}: invalid YAML ({exc})") from exc
    try:
        return config_from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(f"reward config {p}: {exc}") from exc


def default_config() -> RewardConfig:
    """The packaged default, ``podium/data/rewards/default.yaml``."""
    text = resources.files("podium").joinpath("data/rewards/default.yaml").read_text("utf-8")
    return config_from_mapping(yaml.safe_load(text))
