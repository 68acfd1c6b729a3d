"""Actor-critic MLP for discrete, optionally masked, action spaces.

Separate actor and critic networks (no shared trunk), tanh activations and orthogonal
initialisation with a 0.01 gain on the policy head and 1.0 on the value head: the
"37 implementation details of PPO" recipe (Huang et al. 2022), which is also what
Stable-Baselines3's ``MlpPolicy`` builds for PPO, so the two are the same size in benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from podium.errors import ConfigError
from podium.rl.ppo import MASKED_LOGIT, masked_logits


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, 0.0)
    return layer


def mlp(n_in: int, hidden_sizes: Sequence[int], n_out: int, out_gain: float) -> nn.Sequential:
    """``Linear -> tanh`` per hidden width, then a linear head with gain ``out_gain``."""
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden_sizes:
        layers += [_layer(width, h, math.sqrt(2.0)), nn.Tanh()]
        width = h
    layers.append(_layer(width, n_out, out_gain))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """A categorical policy ``pi(a|s)`` and a state-value function ``V(s)`` over flat observations."""

    def __init__(
        self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64)
    ) -> None:
        super().__init__()
        if obs_dim < 1 or n_actions < 1:
            raise ConfigError(
                f"ActorCritic needs obs_dim >= 1 and n_actions >= 1, got {obs_dim}, {n_actions}"
            )
        self.obs_dim = obs_dim
        self.n_actions = n_actions
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.actor = mlp(obs_dim, self.hidden_sizes, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, self.hidden_sizes, 1, out_gain=1.0)

    def logits(self, obs: Tensor, action_masks: Tensor | None = None) -> Tensor:
        """Action logits with invalid actions masked out."""
        return masked_logits(self.actor(obs), action_masks)

    def value(self, obs: Tensor) -> Tensor:
        """``V(s)`` with the trailing unit dimension dropped."""
        out: Tensor = self.critic(obs)
        return out.squeeze(-1)

    def act(
        self,
        obs: Tensor,
        action_masks: Tensor | None = None,
        *,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Choose actions: returns ``(actions, logprobs, values)``.

        Sampling uses ``torch.multinomial`` on the softmax rather than a
        ``torch.distributions.Categorical``: the same distribution without the per-call
        argument validation, which dominates the cost of a 64x64 MLP on one env step.
        """
        logits = self.logits(obs, action_masks)
        log_probs = torch.log_softmax(logits, dim=-1)
        if deterministic:
            actions = log_probs.argmax(dim=-1)
        else:
            actions = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
        logprobs = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return actions, logprobs, self.value(obs)

    def architecture(self) -> dict[str, str]:
        """String metadata that is enough to rebuild this module (stored beside the weights)."""
        return {
            "kind": "podium.rl.ActorCritic",
            "obs_dim": str(self.obs_dim),
            "n_actions": str(self.n_actions),
            "hidden_sizes": ",".join(str(h) for h in self.hidden_sizes),
        }

    @classmethod
    def from_architecture(cls, meta: dict[str, str]) -> ActorCritic:
        """Inverse of :meth:`architecture`; raises :class:`ConfigError` on missing keys."""
        try:
            if meta["kind"] != "podium.rl.ActorCritic":
                raise ConfigError(f"weights are for {meta['kind']!r}, not podium.rl.ActorCritic")
            hidden = tuple(int(h) for h in meta["hidden_sizes"].split(",") if h)
            return cls(int(meta["obs_dim"]), int(meta["n_actions"]), hidden)
        except KeyError as exc:
            raise ConfigError(f"weights metadata lacks {exc.args[0]!r}") from None
        except ValueError as exc:
            raise ConfigError(f"weights metadata is malformed: {exc}") from None


__all__ = ["MASKED_LOGIT", "ActorCritic", "mlp"]
