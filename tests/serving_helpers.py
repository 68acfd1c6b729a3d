"""The policy under test in the serving tests: the real orchestrator network
(:mod:`podium.policy.network`) at the swarm environment's default-pool sizes, kept small in
width so exports stay fast. Everything goes through :func:`make_policy`, so swapping the
network is this one import."""

from __future__ import annotations

import torch
from torch import nn

from podium.policy.network import NetworkConfig, SwarmPolicyNet
from podium.serving.contract import PolicySignature
from podium.serving.export import default_swarm_signature

SIGNATURE: PolicySignature = default_swarm_signature()
"""Sizes of the swarm observation (F, G, P: 19, 89, 15 at the time of writing; any pool's)."""


def make_policy(seed: int) -> nn.Module:
    """A freshly initialised policy network for :data:`SIGNATURE` (distinct weights per seed)."""
    torch.manual_seed(seed)
    net = SwarmPolicyNet(
        NetworkConfig(
            slot_features=SIGNATURE.subtask_features,
            global_features=SIGNATURE.global_features,
            pair_features=SIGNATURE.pair_features,
            d_model=32,
            heads=4,
            layers=2,
        )
    )
    return net.eval()
