"""The orchestrator agent: the policy network plus the glue between it and the environment.

The environment gives a flat observation padded to ``max_subtasks`` slots and a flat action
mask in the same padded layout. The agent trims both to the slots the largest task of the batch
uses (attention costs O(S²), and padding slots are always masked), runs the network, and maps
the chosen actions back to the environment's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from podium.envs.swarm.simulator.env import ObservationLayout
from podium.policy.network import NetworkConfig, ObservationSplit, SwarmPolicyNet


@dataclass(frozen=True, slots=True)
class ActResult:
    """Actions chosen for a batch, in the environment's full layout."""

    actions: NDArray[np.int64]
    """Action indices ``[B]`` (full layout)."""
    log_probs: NDArray[np.float32]
    """log π(a|s) ``[B]``."""
    values: NDArray[np.float32]
    """V(s) ``[B]``."""


class SwarmAgent:
    """A :class:`SwarmPolicyNet` bound to an environment layout."""

    def __init__(
        self, layout: ObservationLayout, net: SwarmPolicyNet | None = None, **net_kwargs: int
    ) -> None:
        self.layout = layout
        self.num_agents = len(layout.agents)
        self.split = ObservationSplit(layout.max_subtasks, layout.slot_features)
        global_dim = layout.size - layout.slots_end
        self.net = net or SwarmPolicyNet(
            NetworkConfig(
                slot_features=layout.slot_features,
                global_features=global_dim,
                num_agents=self.num_agents,
                **net_kwargs,
            )
        )

    def inputs(
        self, obs: NDArray[np.float32], masks: NDArray[np.bool_], used_slots: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Network inputs for a batch whose largest task has ``used_slots`` subtasks."""
        slots, present, globals_ = self.split.split(obs, used_slots)
        trimmed = self.split.trim_mask(masks, self.num_agents, used_slots)
        return (
            torch.from_numpy(np.ascontiguousarray(slots)),
            torch.from_numpy(np.ascontiguousarray(present)),
            torch.from_numpy(np.ascontiguousarray(globals_)),
            torch.from_numpy(np.ascontiguousarray(trimmed)),
        )

    def to_trimmed(self, actions: NDArray[np.int64], used_slots: int) -> NDArray[np.int64]:
        """Full-layout action indices → the trimmed layout of ``used_slots`` slots."""
        per_slot = self.num_agents * 3
        full_wait = self.layout.max_subtasks * per_slot
        out = actions.copy()
        ctrl = actions >= full_wait
        out[ctrl] = used_slots * per_slot + (actions[ctrl] - full_wait)
        return out

    def to_full(self, actions: NDArray[np.int64], used_slots: int) -> NDArray[np.int64]:
        """Trimmed-layout action indices → the environment's full layout."""
        per_slot = self.num_agents * 3
        out = actions.copy()
        ctrl = actions >= used_slots * per_slot
        out[ctrl] = self.layout.max_subtasks * per_slot + (actions[ctrl] - used_slots * per_slot)
        return out

    @torch.no_grad()
    def act(
        self,
        obs: NDArray[np.float32],
        masks: NDArray[np.bool_],
        used_slots: int,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActResult:
        """Sample (or take the argmax of) the masked policy for each row of the batch."""
        logits, values = self.net(*self.inputs(obs, masks, used_slots))
        log_p = torch.log_softmax(logits, dim=-1)
        if greedy:
            a = log_p.argmax(dim=-1)
        else:
            a = torch.multinomial(log_p.exp(), 1, generator=generator).squeeze(-1)
        lp = log_p.gather(-1, a[:, None]).squeeze(-1)
        trimmed = a.numpy().astype(np.int64)
        return ActResult(
            actions=self.to_full(trimmed, used_slots),
            log_probs=lp.numpy().astype(np.float32),
            values=values.numpy().astype(np.float32),
        )

    def evaluate(
        self,
        obs: NDArray[np.float32],
        masks: NDArray[np.bool_],
        used_slots: int,
        actions: NDArray[np.int64],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(log π(a|s), entropy, V(s), logits) with gradients, for the losses."""
        logits, values = self.net(*self.inputs(obs, masks, used_slots))
        log_p = torch.log_softmax(logits, dim=-1)
        a = torch.from_numpy(self.to_trimmed(actions, used_slots))
        lp = log_p.gather(-1, a[:, None]).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return lp, entropy, values, logits
