"""The orchestrator's policy network for the swarm environment: agents read by features.

A set encoder over subtask tokens: each subtask slot of the observation is a token, a global
token carries the clock, capacity and the running-executions table, and a few pre-norm
self-attention blocks mix them. Agents are not an axis of any weight: every (slot, agent) pair
of the observation is one row of pair features (what the agent advertises for the slot's work,
what has been observed of it, its load, the advice; :mod:`podium.envs.swarm.observation`), and

* a shared pair embedding (one linear layer, half the token width: it runs on S·A rows)
  reads each row;
* before attention, each slot token adds the mean of its pairs' (ReLU'd) embeddings over the
  agents that can do it (``can_do`` column), so the set encoder and the global token (WAIT,
  FINISH, value) know how well the slot can be served — one cheap cross-agent mixing step;
* after attention, the START logits of (slot i, agent a) come from a pair head over
  (slot token i, global token, embedding of pair row (i, a)): one hidden ReLU layer, then one
  logit per split choice;
* the observation's advice (the rule engine's decision: a slot row's ``advised_split``
  one-hot, a pair row's ``advised_agent``, the global WAIT / FINISH flags) is added to the
  logits as a residual, ``advice_gain`` (one learned scalar) times the one-hot of the advised
  action (:func:`advice_indicator`). Learned through the pair head alone, each split choice
  came from its own demonstrations and the rare one (split 2) never did; with the shared
  gain, the network's own logits only have to learn where to depart from the advice.

So the number of subtasks *and* the number of agents are free dimensions: one trained network
decides on any pool, including agents added or renamed after training (they are just more
rows), and it is equivariant to the order of the agents (permuting the pool's agents permutes
its START logits the same way) as it is to the order of the subtasks. Padding agents (zero
rows: ``can_do`` 0) change nothing for the real ones, as padding slots do not.

The flat action layout is the environment's (:mod:`podium.envs.swarm.actions`)::

    index = (slot · A + agent) · 3 + j     START slot on agent with split (1, 2, 4)[j]
    index = S · A · 3                       WAIT
    index = S · A · 3 + 1                   FINISH

so flattening the per-pair ``[S, A, 3]`` logits row-major and appending WAIT and FINISH gives
exactly the environment's action vector. Cutting the environment's observation and mask into
these inputs is the environment's own encoding too (:meth:`ObservationLayout.split
<podium.envs.swarm.observation.ObservationLayout.split>`, :meth:`ActionCodec.translate_mask
<podium.envs.swarm.actions.ActionCodec.translate_mask>`); :class:`~podium.policy.agent.SwarmAgent`
applies it.

The ONNX / KServe-V2 signature (see ``docs/serving.md``) is this module's ``forward``:
``subtask_features [B, S, F]``, ``subtask_mask [B, S]`` (bool), ``global_features [B, G]``,
``pair_features [B, S, A, P]``, ``action_mask [B, S·A·3 + 2]`` (bool) → ``logits
[B, S·A·3 + 2]`` (invalid entries set to :data:`MASKED_LOGIT`), ``value [B]``; ``B``, ``S``
and ``A`` are dynamic.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from podium.envs.swarm.actions import CONTROL_ACTIONS, SPLIT_CHOICES
from podium.envs.swarm.observation import (
    GLOBAL_COLUMNS,
    GLOBAL_FEATURES,
    PAIR_COLUMNS,
    PAIR_FEATURES,
    SLOT_COLUMNS,
    SLOT_FEATURES,
)

_CAN_DO = PAIR_COLUMNS.can_do
"""Column of ``can_do`` in a pair row: which agents a slot's cross-agent mean reads (padding
agents are zero rows, so never)."""

_ADVISED_SPLIT = SLOT_COLUMNS.advised_split.slice
"""Columns of a slot row's advised split (one-hot over the split choices)."""
_ADVISED_AGENT = PAIR_COLUMNS.advised_agent
"""Column of a pair row's advised agent."""
_ADVISED_CONTROL = GLOBAL_COLUMNS.advice.slice
"""Columns of the global token's advised WAIT and FINISH (the globals open the token)."""

MASKED_LOGIT = -1.0e9
"""Logit of an invalid action: finite, so softmax and ONNX runtimes stay NaN-free."""


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Shape and size of :class:`SwarmPolicyNet`. No width depends on the pool: the number of
    agents is a dimension of the input, not of the weights."""

    slot_features: int
    """Features per subtask token F (the observation's ``SLOT_FEATURES``)."""
    global_features: int
    """Features of the global token G' (the globals and the flattened running table)."""
    pair_features: int
    """Features per (slot, agent) pair P (the observation's ``PAIR_FEATURES``)."""
    d_model: int = 64
    """Width of the token embeddings."""
    heads: int = 4
    """Attention heads per block."""
    layers: int = 2
    """Self-attention blocks."""
    ff_mult: int = 2
    """Hidden width of each block's feed-forward part, as a multiple of d_model."""

    def to_dict(self) -> dict[str, int]:
        """Plain dict, stored next to the weights so a checkpoint rebuilds its network."""
        return {k: int(v) for k, v in asdict(self).items()}


class _Block(nn.Module):
    """Pre-norm multi-head self-attention + feed-forward, with a key padding mask.

    Written out (not nn.TransformerEncoderLayer) so the ONNX export is plain MatMul/Softmax with
    a dynamic token count, and no fused fast path changes numerics between torch and ONNX.
    """

    def __init__(self, d: int, heads: int, ff_mult: int) -> None:
        super().__init__()
        if d % heads:
            raise ValueError(f"d_model={d} is not divisible by heads={heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff_mult * d), nn.GELU(), nn.Linear(ff_mult * d, d))

    def forward(self, x: Tensor, key_bias: Tensor) -> Tensor:
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q = q.reshape(b, n, h, d // h).transpose(1, 2)
        k = k.reshape(b, n, h, d // h).transpose(1, 2)
        v = v.reshape(b, n, h, d // h).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h) + key_bias[:, None, None, :]
        att = torch.softmax(scores, dim=-1) @ v
        x = x + self.out(att.transpose(1, 2).reshape(b, n, d))
        out: Tensor = x + self.ff(self.norm2(x))
        return out


def pair_width(d_model: int) -> int:
    """Width of the pair embedding and the pair head's hidden layer: half the token width."""
    return max(d_model // 2, 1)


def _mlp(inputs: int, d: int) -> nn.Sequential:
    """The two-layer embedding every input kind goes through."""
    return nn.Sequential(nn.Linear(inputs, d), nn.GELU(), nn.Linear(d, d))


class SwarmPolicyNet(nn.Module):
    """Masked logits over (subtask, agent, split) + WAIT + FINISH, and a state value."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.slot_embed = _mlp(config.slot_features, d)
        self.global_embed = _mlp(config.global_features, d)
        # One projection of each pair row, shared by the cross-agent mean and the pair head.
        # It runs on S·A rows (ten times the slot tokens on a 9-agent pool), so it is one
        # layer of half the token width: the pair tensors are the largest of the forward pass.
        dp = pair_width(d)
        self.pair_embed = nn.Linear(config.pair_features, dp)
        # What a slot token learns of its agents before attention (the cross-agent mixing).
        self.pair_pool = nn.Linear(dp, d)
        self.blocks = nn.ModuleList(
            [_Block(d, config.heads, config.ff_mult) for _ in range(config.layers)]
        )
        self.norm = nn.LayerNorm(d)
        # The pair head: a hidden layer over [slot token; global token; pair row], written as
        # projections summed, so the slot and global parts are computed once per slot and per
        # batch row rather than once per (slot, agent) pair; then one logit per split choice.
        self.start_slot = nn.Linear(d, dp)
        self.start_global = nn.Linear(d, dp, bias=False)
        self.start_out = nn.Linear(dp, SPLIT_CHOICES)
        self.control_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, CONTROL_ACTIONS))
        self.value_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        # The advice as a residual: one learned logit bonus on exactly the advised action.
        # Through the network alone, each split choice is learned from its own demonstrations,
        # and the rare one (split 2: ~1% of starts) never was: clones started split 4 where the
        # teacher said 2, even on their training states. One gain shared by every action is
        # learned from all of them, so the network's own logits only learn the departures.
        # 0 at first: an untrained network stays close to uniform (behaviour cloning sets
        # its starting gain, SwarmPPOConfig.bc_advice_gain), and a checkpoint written before
        # the gain existed loads it as 0, deciding exactly as it did.
        self.advice_gain = nn.Parameter(torch.zeros(()))
        self.reads_advice = reads_advice(config)
        """Whether the inputs carry the advice columns (the observation's widths); a network
        of other widths (a unit test's) has no advice to read, and the gain is unused."""
        # Small initial logits: the untrained policy is close to uniform over valid actions.
        control_last = self.control_head[-1]
        assert isinstance(control_last, nn.Linear)
        for last in (self.start_out, control_last):
            nn.init.normal_(last.weight, std=0.01)
            nn.init.zeros_(last.bias)

    def _load_from_state_dict(  # type: ignore[no-untyped-def]
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
    ) -> None:
        """A checkpoint written before :attr:`advice_gain` existed loads with a gain of 0: its
        logits, and so its decisions, stay exactly what they were."""
        key = prefix + "advice_gain"
        if key not in state_dict and any(k.startswith(prefix) for k in state_dict):
            state_dict[key] = torch.zeros(())
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )

    def forward(
        self,
        subtask_features: Tensor,
        subtask_mask: Tensor,
        global_features: Tensor,
        pair_features: Tensor,
        action_mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """(masked logits [B, S·A·3 + 2], value [B]); see the module docstring."""
        b = subtask_features.shape[0]
        pairs = self.pair_embed(pair_features)  # [B, S, A, dp]
        # Mean over the agents that can do the slot: invariant to their order, and blind to
        # padding agents (all-zero rows), so a padded batch decides as each row alone. As a
        # [1, A] @ [A, dp] product per slot: no [B, S, A, dp] temporary.
        able = (pair_features[..., _CAN_DO] > 0.5).to(pairs.dtype)[:, :, None, :]  # [B,S,1,A]
        summed = (able @ torch.relu(pairs)).squeeze(2)  # [B, S, dp]
        pooled_pairs = summed / able.sum(dim=-1).clamp(min=1.0)
        slot_tokens = self.slot_embed(subtask_features) + self.pair_pool(pooled_pairs)
        g = self.global_embed(global_features)[:, None, :]
        tokens = torch.cat([g, slot_tokens], dim=1)
        present = torch.cat(
            [torch.ones(b, 1, dtype=torch.bool, device=subtask_mask.device), subtask_mask], dim=1
        )
        key_bias = torch.where(
            present,
            torch.zeros((), dtype=tokens.dtype, device=tokens.device),
            torch.full((), MASKED_LOGIT, dtype=tokens.dtype, device=tokens.device),
        )
        for block in self.blocks:
            tokens = block(tokens, key_bias)
        tokens = self.norm(tokens)
        pooled = tokens[:, 0]
        slots = tokens[:, 1:]
        # ReLU, not GELU, on the S·A pair rows: the same shape of function, a fraction of
        # the cost on the largest tensor of the forward pass.
        context = self.start_slot(slots) + self.start_global(pooled)[:, None, :]  # [B, S, dp]
        start = self.start_out(torch.relu(pairs + context[:, :, None, :]))  # [B, S, A, 3]
        logits = torch.cat([start.reshape(b, -1), self.control_head(pooled)], dim=-1)
        if self.reads_advice:
            logits = logits + self.advice_gain * advice_indicator(
                subtask_features, global_features, pair_features
            )
        logits = torch.where(action_mask, logits, torch.full_like(logits, MASKED_LOGIT))
        return logits, self.value_head(pooled).squeeze(-1)


def reads_advice(config: NetworkConfig) -> bool:
    """Whether a network of ``config`` reads the swarm observation, whose advice columns
    :func:`advice_indicator` reads: its slot and pair widths, and a global token that opens
    with the globals."""
    return (
        config.slot_features == SLOT_FEATURES
        and config.pair_features == PAIR_FEATURES
        and config.global_features >= GLOBAL_FEATURES
    )


def advice_indicator(
    subtask_features: Tensor, global_features: Tensor, pair_features: Tensor
) -> Tensor:
    """The advised action as a one-hot over the flat action layout ``[B, S·A·3 + 2]`` (all
    zero when the advisor is off or gave no advice): START(slot, agent, k) where the slot row
    flags split k and the pair row flags the agent, or WAIT / FINISH from the global flags.
    Read from the observation's own advice columns, so it is in the ONNX graph too."""
    b = subtask_features.shape[0]
    splits = subtask_features[..., _ADVISED_SPLIT]  # [B, S, 3]
    agents = pair_features[..., _ADVISED_AGENT]  # [B, S, A]
    start = agents[..., None] * splits[:, :, None, :]  # [B, S, A, 3]
    return torch.cat([start.reshape(b, -1), global_features[:, _ADVISED_CONTROL]], dim=-1)
