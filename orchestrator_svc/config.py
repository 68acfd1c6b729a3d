"""Settings of orchestrator_svc, read from the environment by ``python -m orchestrator_svc``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from podium import topics
from podium.bus.kafka import BROKER_MESSAGE_BYTES
from podium.config import (
    ServiceConfig,
    env,
    non_negative_int,
    port,
    positive_float,
    positive_int,
)
from podium.errors import ConfigError
from podium.service.auth import GrpcSecurityConfig
from podium.serving.endpoint import LOCAL, parse_backend, policy_backend


def _check_task_limit(max_task_bytes: int) -> None:
    """Refuse a task limit whose gRPC receive limit (twice it) the broker could not carry."""
    if 2 * max_task_bytes > BROKER_MESSAGE_BYTES:
        raise ConfigError(
            f"PODIUM_MAX_TASK_BYTES={max_task_bytes} is too large: gRPC accepts twice it, which "
            f"must stay within the broker's message limit of {BROKER_MESSAGE_BYTES} bytes "
            f"(at most {BROKER_MESSAGE_BYTES // 2})"
        )


SERVICE = "orchestrator_svc"
"""Service name (OpenTelemetry ``service.name``, the ``service`` label of its metrics,
default instance prefix)."""

CONTROLLED = "controlled"
"""``PODIUM_ROLLOUT`` value: sessions are routed by the rollout state (the default)."""
LATEST = "latest"
"""``PODIUM_ROLLOUT`` value: the newest loaded version serves every session (training drivers,
demos: the behaviour before rollouts)."""
ROLLOUT_MODES = (CONTROLLED, LATEST)


def rollout_mode(raw: str) -> str:
    """A ``PODIUM_ROLLOUT`` value (:data:`ROLLOUT_MODES`)."""
    value = raw.strip().lower()
    if value not in ROLLOUT_MODES:
        raise ValueError(f"expected one of {', '.join(ROLLOUT_MODES)}, got {raw!r}")
    return value


def share(raw: str) -> float:
    """A fraction of sessions in ``[0, 1]`` (``PODIUM_EXPLORE_SHARE``)."""
    value = float(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a share between 0 and 1, got {raw!r}")
    return value


REVIEW_AUTO, REVIEW_ON, REVIEW_OFF = "auto", "on", "off"
"""``PODIUM_REVIEW`` values."""


def review_mode(raw: str) -> str:
    """A ``PODIUM_REVIEW`` value: auto, on or off."""
    value = raw.strip().lower()
    if value not in (REVIEW_AUTO, REVIEW_ON, REVIEW_OFF):
        raise ValueError(f"expected auto, on or off, got {raw!r}")
    return value


@dataclass(frozen=True)
class OrchestratorConfig(ServiceConfig, GrpcSecurityConfig):
    """orchestrator_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    group_id: str = env("PODIUM_GROUP_ID", default="orchestrator")
    """Prefix of the consumer groups: ``<id>.tasks`` (shared by the replicas, which own sessions
    by tasks partition; also the transactional-id prefix), and per replica
    ``<id>.results.<instance>``, ``<id>.scores.<instance>``, ``<id>.ledger.<instance>`` (and
    ``<id>.rollout.<instance>`` with the learned policy under ``PODIUM_ROLLOUT=controlled``)."""
    grpc_host: str = env("PODIUM_GRPC_HOST", default="0.0.0.0")
    """Address the SessionService listens on (0.0.0.0 in a container, 127.0.0.1 locally)."""
    grpc_port: int = env("PODIUM_GRPC_PORT", default=50051, parse=port)
    """Port of the SessionService (0 = pick a free one; the app reports the bound port)."""
    grpc_max_message_bytes: int = env(
        "PODIUM_GRPC_MAX_MESSAGE_BYTES", default=4 * 1024 * 1024, parse=positive_int
    )
    """Largest gRPC message sent (GetSession and StreamSession replies). What gRPC *accepts*
    is not set here but derived from the task limits: :attr:`grpc_max_receive_bytes`."""
    max_task_bytes: int = env("PODIUM_MAX_TASK_BYTES", default=256 * 1024, parse=positive_int)
    """Largest SubmitTask request (serialised, text or message), checked before the spec is
    parsed; also the most a text spec may stand for once its YAML aliases are expanded. Well
    under the broker's message limit: the task travels in TaskSubmitted and again in the
    session's Trajectory. At most half of :data:`BROKER_MESSAGE_BYTES`."""
    max_subtasks: int = env("PODIUM_MAX_SUBTASKS", default=256, parse=positive_int)
    """Most subtasks a submitted task may have, checked before the spec is validated (a
    session's decisions, trajectory and planning cost all grow with it)."""
    max_pending_specs: int = env("PODIUM_MAX_PENDING_SPECS", default=32, parse=positive_int)
    """Text specs waiting for or in the parser threads at once; beyond it SubmitTask fails
    RESOURCE_EXHAUSTED naming this setting (bounds what a flood of maximal specs holds)."""
    grpc_reflection: bool = env("PODIUM_GRPC_REFLECTION", default=False)
    """Serve gRPC server reflection (lets ``grpcurl`` list and describe the API). Off by
    default: it hands the whole contract to anyone who can reach the port."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Pool spec file (JSON/YAML) the scheduler plans for; empty = the shipped default.
    Must be the same pool subagent_svc simulates."""
    policy: str = env("PODIUM_POLICY", default="cpls")
    """Scheduling policy: a rule engine of the swarm environment (cpls, cpls-online, greedy,
    sequential), or ``learned``: the versions announced on the policy-updates topic, served as
    ``PODIUM_ROLLOUT`` says (cpls until a rollout state names a learned version)."""
    rollout: str = env("PODIUM_ROLLOUT", default=CONTROLLED, parse=rollout_mode)
    """Learned policy: which version runs a session. ``controlled``: the rollout state on
    ``podium.rollout.v1`` decides (live, canary and baseline arms by a stable hash of the
    session id; cpls until a state names a learned version: a version never goes live because
    it loaded); ``latest``: the newest loaded version serves every new session (training
    drivers and demos, which run no rollout controller)."""
    rollout_topic: str = env("PODIUM_ROLLOUT_TOPIC", default=topics.ROLLOUT)
    """Learned policy under ``PODIUM_ROLLOUT=controlled``: the compacted topic the rollout
    controller writes the rollout state to (the same variable as the controller's)."""
    policy_sample_from: tuple[str, ...] = env("PODIUM_POLICY_SAMPLE_FROM", default=("trainer",))
    """Learned policy: sessions whose ``submitted_by`` starts with one of these (comma-separated)
    sample their actions (training); all others take the argmax (live traffic, evaluation)."""
    explore_share: float = env("PODIUM_EXPLORE_SHARE", default=0.0, parse=share)
    """Learned policy: the share of live-arm sessions decided by a learned version that sample
    their actions whoever submitted them (0 to 1), chosen from a hash of the session id (a
    replay or a twin of the session agrees) independent of the rollout's buckets; recorded as
    sampled (``actions=sampled``), so the learner learns from live traffic without a
    ``trainer`` client. Canary and baseline sessions never explore (their guardrail
    comparison stays greedy against greedy)."""
    scout: bool = env("PODIUM_SCOUT", default=False)
    """Learned policy: every session that takes the argmax also *scouts*
    (:mod:`podium.envs.swarm.scouting`): a start goes to a capable agent the statistics store
    has seen fewer than two times on that kind instead, where the schedule's slack absorbs
    that agent's expected time twice over, so an agent better than it advertises is found
    without lengthening the critical path. Sampled sessions never scout; without the
    statistics store (``PODIUM_AGENT_STATS=off``) nothing is scouted (and it says so once)."""
    policy_max_subtasks: int = env("PODIUM_POLICY_MAX_SUBTASKS", default=64, parse=positive_int)
    """Learned policy: environment slot count S for versions whose metadata does not say which
    S they were trained with (the running-table features are scaled by it)."""
    policy_backend: str = env("PODIUM_POLICY_BACKEND", default=LOCAL, parse=policy_backend)
    """Learned policy: where its decisions are computed. ``local``: torch in this process;
    ``v2://HOST:PORT``: a KServe-V2 gRPC server (Triton, or MLServer on CPU machines) serving
    the model repository the learner exports into; each announced version is verified against
    its ``onnx_sha256`` and loaded through the repository API (docs/serving.md)."""
    policy_trusted_keys: str = env("PODIUM_POLICY_TRUSTED_KEYS", default="")
    """Learned policy (required with it): the Ed25519 public keys whose signed ``PolicyUpdated``
    announcements are served, comma-separated PEM files or directories (a mounted Secret);
    several during a key rotation. Make a pair with ``podium keys generate --out DIR``."""
    serving_timeout_s: float = env("PODIUM_SERVING_TIMEOUT_S", default=5.0, parse=positive_float)
    """Served backend: deadline of one inference call, in seconds."""
    serving_ready_timeout_s: float = env(
        "PODIUM_SERVING_READY_TIMEOUT_S", default=30.0, parse=positive_float
    )
    """Served backend: how long start-up waits for the server to answer ready."""
    max_sessions: int = env("PODIUM_MAX_SESSIONS", default=64, parse=positive_int)
    """Sessions run at once; further TaskSubmitted events wait (backpressure on the topic)."""
    session_timeout_s: float = env("PODIUM_SESSION_TIMEOUT_S", default=120.0, parse=positive_float)
    """Wall-clock time a session may wait for sub-agent results before it is failed."""
    max_decisions: int = env("PODIUM_MAX_DECISIONS", default=10_000, parse=positive_int)
    """Decisions after which a session is ended as a loop, whatever the policy does."""
    keep_sessions: int = env("PODIUM_KEEP_SESSIONS", default=10_000, parse=positive_int)
    """Finished sessions kept in memory for GetSession / StreamSession (oldest dropped)."""
    max_open_sessions: int = env("PODIUM_MAX_OPEN_SESSIONS", default=256, parse=positive_int)
    """Admission control: sessions accepted by this replica's SubmitTask and not yet ended;
    beyond it SubmitTask fails RESOURCE_EXHAUSTED naming this setting (instead of queueing
    without bound)."""
    max_trajectory_bytes: int = env(
        "PODIUM_MAX_TRAJECTORY_BYTES", default=900 * 1024, parse=positive_int
    )
    """Largest Trajectory record written, envelope included; keep it below the broker's
    message.max.bytes (1 MiB by default). A larger trajectory is trimmed to fit (observation
    tensors first, then execution contexts, then decisions) and labelled ``trimmed``."""
    review: str = env("PODIUM_REVIEW", default=REVIEW_AUTO, parse=review_mode)
    """Hold sensitive subtasks for human review (ReviewService): ``on``, ``off``, or ``auto``
    (the default: on exactly when ``PODIUM_GRPC_TOKENS`` authenticates reviewers; off, as
    before, in development and training drivers without tokens)."""
    review_deadline_s: float = env("PODIUM_REVIEW_DEADLINE_S", default=3600.0, parse=positive_float)
    """Seconds a held sensitive subtask waits for a decision; then it expires (rejected)."""
    agent_stats: bool = env("PODIUM_AGENT_STATS", default=True)
    """Keep a statistics store of what the sub-agents did (:class:`podium.observed.AgentStats`),
    fed by every session of every replica from the trajectory topic (a group of this replica's
    own, ``<id>.stats.<instance>``, followed from its end at start-up after recording the newest
    ``PODIUM_AGENT_STATS_WARM`` trajectories of each partition). Every session's environment
    reads it: the observation's
    estimate columns and ``PODIUM_POLICY=cpls-online``. ``off``: estimates are the pool
    spec's advertised profiles (cpls-online is then plain cpls)."""
    agent_stats_warm: int = env("PODIUM_AGENT_STATS_WARM", default=200, parse=non_negative_int)
    """Statistics store: the newest trajectories per partition of the trajectory topic recorded
    at start-up, so a restarted replica plans on what the sub-agents have been doing (0: start
    from the advertised profiles)."""
    agent_stats_half_life: float = env(
        "PODIUM_AGENT_STATS_HALF_LIFE", default=200.0, parse=positive_float
    )
    """Statistics store: executions of one (agent, kind) after which an observation weighs
    half as much; after a drift the estimates move most of the way within two half-lives."""
    agent_stats_prior_weight: float = env(
        "PODIUM_AGENT_STATS_PRIOR_WEIGHT", default=5.0, parse=positive_float
    )
    """Statistics store: how many executions an agent's advertised profile is worth against
    what is observed of it (its confidence is observed / (observed + this))."""

    @property
    def review_on(self) -> bool:
        """Whether sensitive subtasks are held for review (see :attr:`review`)."""
        return self.review == REVIEW_ON or (self.review == REVIEW_AUTO and bool(self.grpc_tokens))

    @property
    def grpc_max_receive_bytes(self) -> int:
        """What gRPC accepts: twice :attr:`max_task_bytes`, so a request somewhat over the
        task limit is still read and answered INVALID_ARGUMENT naming the setting, while
        gRPC itself refuses (RESOURCE_EXHAUSTED) anything the broker could not carry."""
        return 2 * self.max_task_bytes

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_task_limit(self.max_task_bytes)
        if self.max_trajectory_bytes > BROKER_MESSAGE_BYTES:
            raise ConfigError(
                f"PODIUM_MAX_TRAJECTORY_BYTES={self.max_trajectory_bytes} is over the broker's "
                f"message limit of {BROKER_MESSAGE_BYTES} bytes: trajectories would be refused"
            )
        # Also for configs built in code, which skip the variables' parse functions.
        if self.review not in (REVIEW_AUTO, REVIEW_ON, REVIEW_OFF):
            raise ConfigError(f"PODIUM_REVIEW={self.review!r}: expected auto, on or off")
        for name, value in (
            ("PODIUM_AGENT_STATS_HALF_LIFE", self.agent_stats_half_life),
            ("PODIUM_AGENT_STATS_PRIOR_WEIGHT", self.agent_stats_prior_weight),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}={value!r}: expected a finite number > 0")
        if self.rollout not in ROLLOUT_MODES:
            raise ConfigError(
                f"PODIUM_ROLLOUT={self.rollout!r}: expected one of {', '.join(ROLLOUT_MODES)}"
            )
        if parse_backend(self.policy_backend) is not None and self.policy != "learned":
            raise ConfigError(
                f"PODIUM_POLICY_BACKEND={self.policy_backend} serves the learned policy only; "
                f"PODIUM_POLICY={self.policy!r} is a rule engine (set PODIUM_POLICY=learned)"
            )
