"""Podium: production reinforcement learning for agent swarms.

The shared core: event bus, codec, telemetry, config, environments, policies, RL math and the
CLI. Services (orchestrator_svc, subagent_svc, reward_svc, learner_svc) build on it and meet
only through the bus, gRPC and the protos.
"""

from podium.errors import (
    ArtifactError,
    BusError,
    ConfigError,
    DecodeError,
    PodiumError,
    ProcessingError,
    SpecError,
)

__version__ = "0.1.0"

__all__ = [
    "ArtifactError",
    "BusError",
    "ConfigError",
    "DecodeError",
    "PodiumError",
    "ProcessingError",
    "SpecError",
    "__version__",
]
