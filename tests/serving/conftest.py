"""Fixtures for serving tests: the policy under test and the real KServe-V2 server.

The policy is the real orchestrator network (:mod:`podium.policy.network`) at the swarm
environment's default-pool sizes, kept small in width so exports stay fast. Everything else
goes through :func:`make_policy`, so swapping the network is this one import.

Server tests need a running KServe-V2 server (``scripts/v2server.sh start``) named by
``$PODIUM_V2_GRPC`` and the model repository it serves, ``$PODIUM_V2_REPOSITORY``: the tests
export into that directory and load through the repository API. Without them the tests are
skipped when run by hand and fail under CI (``CI=true``), where a missing server is a broken
pipeline, not an optional extra.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from podium.policy.network import NetworkConfig, SwarmPolicyNet
from podium.serving.contract import PolicySignature
from podium.serving.export import default_swarm_signature

GRPC_ENV = "PODIUM_V2_GRPC"
REPOSITORY_ENV = "PODIUM_V2_REPOSITORY"
SIGNATURE: PolicySignature = default_swarm_signature()
"""Sizes of the shipped default pool: F=45, G=138, K=27 at the time of writing."""


def make_policy(seed: int) -> nn.Module:
    """A freshly initialised policy network for :data:`SIGNATURE` (distinct weights per seed)."""
    torch.manual_seed(seed)
    net = SwarmPolicyNet(
        NetworkConfig(
            slot_features=SIGNATURE.subtask_features,
            global_features=SIGNATURE.global_features,
            num_agents=SIGNATURE.actions_per_subtask // 3,
            d_model=32,
            heads=4,
            layers=2,
        )
    )
    return net.eval()


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _need(var: str) -> str:
    value = os.environ.get(var, "").strip()
    if not value:
        if _in_ci():
            pytest.fail(f"CI=true but ${var} is not set: CI must start scripts/v2server.sh first")
        pytest.skip(f'no KServe-V2 server: set ${var} (eval "$(scripts/v2server.sh start DIR)")')
    return value


@pytest.fixture(scope="session")
def v2_grpc() -> str:
    """``host:port`` of the real V2 server's gRPC endpoint."""
    return _need(GRPC_ENV)


@pytest.fixture(scope="session")
def v2_repository() -> Path:
    """The model repository directory the server serves (tests export into it)."""
    path = Path(_need(REPOSITORY_ENV))
    if not path.is_dir():
        pytest.fail(f"${REPOSITORY_ENV}={path} is not a directory")
    return path


@pytest.fixture
def model_name(v2_grpc: str) -> Iterator[str]:
    """A model name unique to the test (tests share one server); unloaded afterwards."""
    import tritonclient.grpc as grpcclient

    name = f"policy_{uuid.uuid4().hex[:10]}"
    yield name
    client = grpcclient.InferenceServerClient(v2_grpc)
    try:
        client.unload_model(name)
    except Exception:
        pass  # never loaded, or the test unloaded it itself
    finally:
        client.close()
