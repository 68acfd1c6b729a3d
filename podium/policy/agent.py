"""The orchestrator agent: the policy network plus the glue between it and the environment.

The environment gives a flat observation padded to ``max_subtasks`` slots and a flat action
mask in the same padded layout. The agent trims both to the slots the largest task of the batch
uses (attention costs O(S²), and padding slots are always masked), runs the network, and maps
the chosen actions back to the environment's layout. The cutting and index mapping are the
environment's encoding (:class:`~podium.envs.swarm.observation.ObservationLayout`,
:class:`~podium.envs.swarm.actions.ActionCodec`); the agent only applies them.

Attention costs O(S²) and the pair rows O(S·A), so a batch mixing tasks of 5 and 60 subtasks
pays for 60 on every row: :func:`act_by_size` cuts one pool's batch into forward passes by
task size (:func:`size_buckets`), puts the logits back into the batch's layout and chooses
once, so it samples exactly what :meth:`SwarmAgent.act` samples on the whole batch.

A :class:`SwarmAgent` is bound to one layout (one pool: its action layout has ``A`` agents),
but the network is not: any number of agents bind to one network, one per pool.
:func:`act_mixed` decides for sessions on different pools in one forward pass, padding the
agents as well as the slots (:func:`podium.serving.contract.stack_padded`, the one padding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from podium.envs.swarm.actions import ActionCodec
from podium.envs.swarm.observation import ObservationLayout
from podium.envs.swarm.state import SwarmState
from podium.errors import ArtifactError
from podium.policy.network import MASKED_LOGIT, NetworkConfig, SwarmPolicyNet
from podium.serving.contract import (
    PolicyInputs,
    PolicyOutputs,
    PolicySignature,
    stack_padded,
    unstack_padded,
)


def guard_mask(state: SwarmState, mask: NDArray[np.bool_], codec: ActionCodec) -> NDArray[np.bool_]:
    """The action mask minus the starts that loop detection would end the session on.

    Starting a unit again on an agent it already failed on ``loop_retry_limit`` times is a
    retry loop: the environment (rightly) ends the session there, incomplete. A learned
    policy must never be able to choose that, neither by chance nor because ending early
    looks cheap, so the orchestrator's policy acts on this guarded mask. If the guard would
    leave nothing valid, the unguarded mask is returned and loop detection does its job.
    """
    limit = state.config.loop_retry_limit
    guarded: NDArray[np.bool_] | None = None
    for slot, idle in enumerate(state.failed_idle):
        if idle <= 0 or slot >= codec.max_subtasks:
            continue
        unit = state.next_unit(slot)
        if unit < 0:
            continue
        for agent, fails in enumerate(state.u_fails_on[unit]):
            if fails >= limit:
                if guarded is None:
                    guarded = mask.copy()
                guarded[codec.start(slot, agent, 1)] = False
    if guarded is None or not guarded.any():
        return mask
    return guarded


@dataclass(frozen=True, slots=True)
class ActResult:
    """Actions chosen for a batch, in the environment's full layout."""

    actions: NDArray[np.int64]
    """Action indices ``[B]`` (full layout)."""
    log_probs: NDArray[np.float32]
    """log π(a|s) ``[B]``."""
    values: NDArray[np.float32]
    """V(s) ``[B]``."""


def layout_widths(layout: ObservationLayout) -> tuple[int, int, int]:
    """(slot, global token, pair) widths of ``layout``: what a network reading it is built for."""
    return layout.slot_features, layout.global_token_features, layout.pair_features


class SwarmAgent:
    """A :class:`SwarmPolicyNet` bound to an environment layout (its pool's action layout)."""

    def __init__(
        self, layout: ObservationLayout, net: SwarmPolicyNet | None = None, **net_kwargs: int
    ) -> None:
        self.layout = layout
        self.num_agents = len(layout.agents)
        self.codec = ActionCodec(layout.max_subtasks, self.num_agents)
        """The environment's action layout (all ``max_subtasks`` slots)."""
        f, g, p = layout_widths(layout)
        if net is None:
            net = SwarmPolicyNet(
                NetworkConfig(slot_features=f, global_features=g, pair_features=p, **net_kwargs)
            )
        cfg = net.config
        if (cfg.slot_features, cfg.global_features, cfg.pair_features) != (f, g, p):
            raise ArtifactError(
                f"the policy reads (slot, global, pair) widths "
                f"{(cfg.slot_features, cfg.global_features, cfg.pair_features)}, the "
                f"environment's observation has {(f, g, p)} (another observation version or "
                "running-table size): retrain it for this observation"
            )
        self.net = net

    @property
    def signature(self) -> PolicySignature:
        """The serving signature of the bound network."""
        cfg = self.net.config
        return PolicySignature(cfg.slot_features, cfg.global_features, cfg.pair_features)

    def inputs(
        self, obs: NDArray[np.float32], masks: NDArray[np.bool_], used_slots: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Network inputs for a batch whose largest task has ``used_slots`` subtasks."""
        slots, present, globals_, pairs = self.layout.split(obs, used_slots)
        trimmed = self.codec.translate_mask(masks, self.codec.with_slots(used_slots))
        return (
            torch.from_numpy(np.ascontiguousarray(slots)),
            torch.from_numpy(np.ascontiguousarray(present)),
            torch.from_numpy(np.ascontiguousarray(globals_)),
            torch.from_numpy(np.ascontiguousarray(pairs)),
            torch.from_numpy(np.ascontiguousarray(trimmed)),
        )

    def policy_inputs(
        self, obs: NDArray[np.float32], masks: NDArray[np.bool_], used_slots: int
    ) -> PolicyInputs:
        """:meth:`inputs` as numpy arrays in the serving layout (a served backend's request)."""
        return PolicyInputs(*(t.numpy() for t in self.inputs(obs, masks, used_slots)))

    def to_trimmed(self, actions: NDArray[np.int64], used_slots: int) -> NDArray[np.int64]:
        """Full-layout action indices → the trimmed layout of ``used_slots`` slots."""
        return self.codec.translate_many(actions, self.codec.with_slots(used_slots))

    def to_full(self, actions: NDArray[np.int64], used_slots: int) -> NDArray[np.int64]:
        """Trimmed-layout action indices → the environment's full layout."""
        return self.codec.with_slots(used_slots).translate_many(actions, self.codec)

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
        return self.select(logits, values, used_slots, greedy=greedy, generator=generator)

    @torch.no_grad()
    def select(
        self,
        logits: Tensor,
        values: Tensor,
        used_slots: int,
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActResult:
        """Choose actions from the network's outputs ``logits [B, A']``, ``values [B]`` on
        :meth:`inputs` of ``used_slots`` slots, wherever they were computed.

        :meth:`act` runs the network in this process; the orchestrator's served backend gets
        the same outputs from a KServe-V2 server and chooses with this same function, so both
        sample identically from identical logits (same generator, same draws).
        """
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


PASS_OVERHEAD_SLOT_ROWS = 100
"""The fixed cost of one forward pass, in padded slot rows: a pass over ``B`` rows of ``S``
slots costs about ``100 + B·S`` such rows on the default network (measured on one core: 0.55 ms
for one row of 5 slots, 10.5 ms for 32 rows of 60; docs/training-profile.md). It decides how
finely :func:`size_buckets` cuts a batch: a pass is worth splitting off only when it saves more
padding than that."""


def size_buckets(sizes: Sequence[int], overhead: int = PASS_OVERHEAD_SLOT_ROWS) -> list[list[int]]:
    """Rows of a batch grouped into forward passes by their task's size (``sizes[i]``: row
    ``i``'s subtasks), minimising ``Σ (overhead + rows · largest size)`` over the passes.

    Rows are taken in order of size, so an optimal grouping cuts that order into runs; the
    dynamic programme runs over the distinct sizes (at most the largest task's), not the rows.
    Each pass lists its rows in increasing order; passes come smallest tasks first.
    """
    if not sizes:
        return []
    if min(sizes) < 1 or overhead < 0:
        raise ValueError(f"sizes must be >= 1 and overhead >= 0, got {min(sizes)}, {overhead}")
    distinct = sorted(set(sizes))
    counts = [0] * len(distinct)
    where = {s: k for k, s in enumerate(distinct)}
    for s in sizes:
        counts[where[s]] += 1
    best = [0.0] + [math.inf] * len(distinct)  # best[j]: the cost of the j smallest sizes
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # the last pass covers distinct sizes i .. j-1
            rows += counts[i]
            cost = best[i] + overhead + rows * distinct[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], len(distinct)
    while j > 0:
        bounds.append((distinct[cut[j]], distinct[j - 1]))
        j = cut[j]
    return [[r for r, s in enumerate(sizes) if lo <= s <= hi] for lo, hi in reversed(bounds)]


@torch.no_grad()
def act_by_size(
    agent: SwarmAgent,
    obs: NDArray[np.float32],
    masks: NDArray[np.bool_],
    sizes: Sequence[int],
    *,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> ActResult:
    """:meth:`SwarmAgent.act` on the whole batch (``used_slots`` = its largest task), with
    the network run once per :func:`size_buckets` pass, each trimmed to its own largest task.

    A row's logits do not depend on how many padding slots it was cut with (padding slots are
    masked keys and invalid actions), so each pass's logits are put back into the batch's
    layout (the START entries of the row's own slots, then WAIT and FINISH; the padding slots'
    START entries :data:`~podium.policy.network.MASKED_LOGIT`, as the network masks them) and
    the actions chosen once over the whole batch: the same generator draws, in the same order,
    as :meth:`SwarmAgent.act` makes (equal up to float rounding of the logits).
    """
    if len(sizes) != len(obs):
        raise ValueError(f"{len(obs)} observations but {len(sizes)} sizes")
    used = max(sizes)
    buckets = size_buckets(sizes)
    if len(buckets) <= 1:
        return agent.act(obs, masks, used, greedy=greedy, generator=generator)
    full = agent.codec.with_slots(used)
    logits = torch.full((len(sizes), full.size), MASKED_LOGIT)
    values = torch.empty(len(sizes))
    for rows in buckets:
        n = max(sizes[r] for r in rows)
        own_wait = agent.codec.with_slots(n).wait
        part, part_values = agent.net(*agent.inputs(obs[rows], masks[rows], n))
        idx = torch.as_tensor(rows)
        logits[idx, :own_wait] = part[:, :own_wait]
        logits[idx, full.wait :] = part[:, own_wait:]
        values[idx] = part_values
    return agent.select(logits, values, used, greedy=greedy, generator=generator)


@dataclass(frozen=True, slots=True)
class Group:
    """Sessions of one pool in a :func:`act_mixed` batch."""

    agent: SwarmAgent
    """The network bound to the pool's layout."""
    obs: NDArray[np.float32]
    """Observations ``[B_g, size]`` (the layout's)."""
    masks: NDArray[np.bool_]
    """Action masks ``[B_g, codec.size]`` (full layout)."""
    used_slots: int
    """Subtasks of the group's largest task."""


@torch.no_grad()
def act_mixed(
    groups: list[Group], *, greedy: bool = False, generator: torch.Generator | None = None
) -> list[ActResult]:
    """One forward pass deciding for sessions on different pools (one result per group).

    Each group's inputs are cut as :meth:`SwarmAgent.inputs` cuts them, then padded to the
    most slots and agents of the batch (:func:`~podium.serving.contract.stack_padded`:
    padding slots and agents change nothing for the real ones), and the outputs unpadded back
    into each group's own layout, where its agent chooses (:meth:`SwarmAgent.select`, groups
    in order, one generator). With one group it is exactly :meth:`SwarmAgent.act`. Every
    group's agent must be bound to the same network.
    """
    if len(groups) == 1:
        g = groups[0]
        return [g.agent.act(g.obs, g.masks, g.used_slots, greedy=greedy, generator=generator)]
    net = groups[0].agent.net
    if any(g.agent.net is not net for g in groups):
        raise ValueError("act_mixed: every group must run the same network")
    parts = [g.agent.policy_inputs(g.obs, g.masks, g.used_slots) for g in groups]
    signature = groups[0].agent.signature
    stacked = stack_padded(parts, signature)
    logits, values = net(*(torch.from_numpy(a) for a in stacked.arrays().values()))
    outputs = unstack_padded(
        PolicyOutputs(logits.numpy(), values.numpy(), "local"), parts, signature
    )
    return [
        g.agent.select(
            torch.from_numpy(out.logits),
            torch.from_numpy(out.value),
            g.used_slots,
            greedy=greedy,
            generator=generator,
        )
        for g, out in zip(groups, outputs, strict=True)
    ]
