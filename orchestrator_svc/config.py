"""Settings of orchestrator_svc, read from the environment by ``python -m orchestrator_svc``."""

from __future__ import annotations

from dataclasses import dataclass

from podium.config import ServiceConfig, env, port, positive_float, positive_int
from podium.errors import ConfigError
from podium.serving.endpoint import LOCAL, parse_backend, policy_backend


@dataclass(frozen=True)
class OrchestratorConfig(ServiceConfig):
    """orchestrator_svc settings (plus the shared ones of :class:`podium.config.ServiceConfig`)."""

    group_id: str = env("PODIUM_GROUP_ID", default="orchestrator")
    """Prefix of the consumer groups (``<id>.tasks``, ``<id>.results``, ``<id>.scores``)."""
    grpc_host: str = env("PODIUM_GRPC_HOST", default="0.0.0.0")
    """Address the SessionService listens on (0.0.0.0 in a container, 127.0.0.1 locally)."""
    grpc_port: int = env("PODIUM_GRPC_PORT", default=50051, parse=port)
    """Port of the SessionService (0 = pick a free one; the app reports the bound port)."""
    grpc_max_message_bytes: int = env(
        "PODIUM_GRPC_MAX_MESSAGE_BYTES", default=4 * 1024 * 1024, parse=positive_int
    )
    """Largest gRPC message accepted or sent; bigger task specs are rejected by gRPC itself."""
    pool_spec: str = env("PODIUM_POOL_SPEC", default="")
    """Pool spec file (JSON/YAML) the scheduler plans for; empty = the shipped default.
    Must be the same pool subagent_svc simulates."""
    policy: str = env("PODIUM_POLICY", default="cpls")
    """Scheduling policy: a rule engine of the swarm environment (cpls, greedy, sequential), or
    ``learned``: the versions announced on the policy-updates topic, hot-swapped, with cpls
    deciding until the first one has loaded."""
    policy_sample_from: tuple[str, ...] = env("PODIUM_POLICY_SAMPLE_FROM", default=("trainer",))
    """Learned policy: sessions whose ``submitted_by`` starts with one of these (comma-separated)
    sample their actions (training); all others take the argmax (live traffic, evaluation)."""
    policy_max_subtasks: int = env("PODIUM_POLICY_MAX_SUBTASKS", default=64, parse=positive_int)
    """Learned policy: environment slot count S for versions whose metadata does not say which
    S they were trained with (the running-table features are scaled by it)."""
    policy_backend: str = env("PODIUM_POLICY_BACKEND", default=LOCAL, parse=policy_backend)
    """Learned policy: where its decisions are computed. ``local``: torch in this process;
    ``v2://HOST:PORT``: a KServe-V2 gRPC server (Triton, or MLServer on CPU machines) serving
    the model repository the learner exports into; each announced version is verified against
    its ``onnx_sha256`` and loaded through the repository API (docs/serving.md)."""
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

    def __post_init__(self) -> None:
        super().__post_init__()
        # Also for configs built in code, which skip the variable's parse function.
        if parse_backend(self.policy_backend) is not None and self.policy != "learned":
            raise ConfigError(
                f"PODIUM_POLICY_BACKEND={self.policy_backend} serves the learned policy only; "
                f"PODIUM_POLICY={self.policy!r} is a rule engine (set PODIUM_POLICY=learned)"
            )
