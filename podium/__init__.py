"""Podium: production reinforcement learning for agent swarms.

The library: event bus, codec, telemetry, config, the service shell, environments, policies,
RL math, rewards and serving clients. It imports no service; the services build on it and meet
only through the bus, gRPC and the protos; the top floor (the CLI, the training job) composes
them.
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
