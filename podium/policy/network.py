"""The orchestrator's policy network for the swarm environment.

A set encoder over subtask tokens: each subtask slot of the observation is a token, a global
token carries the clock, capacity and the running-executions table, and a few pre-norm
self-attention blocks mix them. Each subtask token emits its own START logits over
(agent, split k); the global token emits WAIT, FINISH and the value. Because the START head is
applied per token, the number of subtasks is a free dimension: a policy trained on tasks of
10–30 subtasks runs unchanged on 100, and nothing in the network depends on ``max_parallel``.

The flat action layout is the environment's (:mod:`podium.envs.swarm.actions`)::

    index = (slot · A + agent) · 3 + j     START slot on agent with split (1, 2, 4)[j]
    index = S · A · 3                       WAIT
    index = S · A · 3 + 1                   FINISH

so flattening the per-token ``[S, A·3]`` logits row-major and appending WAIT and FINISH gives
exactly the environment's action vector. Cutting the environment's observation and mask into
these inputs is the environment's own encoding too (:meth:`ObservationLayout.split
<podium.envs.swarm.observation.ObservationLayout.split>`, :meth:`ActionCodec.translate_mask
<podium.envs.swarm.actions.ActionCodec.translate_mask>`); :class:`~podium.policy.agent.SwarmAgent`
applies it.

The ONNX / KServe-V2 signature (see ``docs/serving.md``) is this module's ``forward``:
``subtask_features [B, S, F]``, ``subtask_mask [B, S]`` (bool), ``global_features [B, G]``,
``action_mask [B, S·A·3 + 2]`` (bool) → ``logits [B, S·A·3 + 2]`` (invalid entries set to
:data:`MASKED_LOGIT`), ``value [B]``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from podium.envs.swarm.actions import CONTROL_ACTIONS, SPLIT_CHOICES

MASKED_LOGIT = -1.0e9
"""Logit of an invalid action: finite, so softmax and ONNX runtimes stay NaN-free."""


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Shape and size of :class:`SwarmPolicyNet`."""

    slot_features: int
    """Features per subtask token F (the environment's ObservationLayout.slot_features)."""
    global_features: int
    """Global features G, including the flattened running-executions table."""
    num_agents: int
    """Agents A in the pool; START logits per token are A × the split choices (3)."""
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


class SwarmPolicyNet(nn.Module):
    """Masked logits over (subtask, agent, split) + WAIT + FINISH, and a state value."""

    def __init__(self, config: NetworkConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.slot_embed = nn.Sequential(
            nn.Linear(config.slot_features, d), nn.GELU(), nn.Linear(d, d)
        )
        self.global_embed = nn.Sequential(
            nn.Linear(config.global_features, d), nn.GELU(), nn.Linear(d, d)
        )
        self.blocks = nn.ModuleList(
            [_Block(d, config.heads, config.ff_mult) for _ in range(config.layers)]
        )
        self.norm = nn.LayerNorm(d)
        # START logits read the token and the global context it attended to.
        self.start_head = nn.Sequential(
            nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, config.num_agents * SPLIT_CHOICES)
        )
        self.control_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, CONTROL_ACTIONS))
        self.value_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        # Small initial logits: the untrained policy is close to uniform over valid actions.
        for head in (self.start_head, self.control_head):
            last = head[-1]
            assert isinstance(last, nn.Linear)
            nn.init.normal_(last.weight, std=0.01)
            nn.init.zeros_(last.bias)

    def forward(
        self,
        subtask_features: Tensor,
        subtask_mask: Tensor,
        global_features: Tensor,
        action_mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """(masked logits [B, S·A·3 + 2], value [B]); see the module docstring."""
        b, s, _ = subtask_features.shape
        g = self.global_embed(global_features)[:, None, :]
        tokens = torch.cat([g, self.slot_embed(subtask_features)], dim=1)
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
        start = self.start_head(torch.cat([slots, pooled[:, None, :].expand(b, s, -1)], dim=-1))
        logits = torch.cat([start.reshape(b, -1), self.control_head(pooled)], dim=-1)
        logits = torch.where(action_mask, logits, torch.full_like(logits, MASKED_LOGIT))
        return logits, self.value_head(pooled).squeeze(-1)
