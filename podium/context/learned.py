"""The learned Context-1 agent: a trained actor-critic playing :class:`ContextEnv`.

Its weights are one safetensors file with a sha256 sidecar — the format every Podium policy
version has (:mod:`podium.policy.artifacts`), so a version the learner published
(``<artifacts>/<model>/<version>/weights.safetensors``) and the file ``podium train --env
context`` leaves as its result load the same way. The file's metadata holds the network's
shape and the environment's observation columns (:func:`~podium.context.env.observation_features`)
it was trained on: a policy is refused by name on an environment whose observation differs
(another ``lookahead``, another release's features), since silently reading the wrong columns
would act on nonsense.

:class:`LearnedPolicy` has the interface of the heuristics (``name`` and ``act(env)``), so
:func:`podium.context.heuristics.run_episode` and the benchmark play it like any baseline. It
acts greedily (the most probable valid action) by default: an evaluation must be repeatable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray

from podium.context.env import ACTIONS, ContextEnv, observe
from podium.errors import ConfigError
from podium.policy.artifacts import (
    WEIGHTS_FILE,
    ArtifactRef,
    load_into,
    load_weights,
    publish_weights,
)
from podium.rl.networks import ActorCritic

ENV_ID = "podium/Context-v0"
"""The environment the weights are for (recorded in their metadata)."""
FEATURES_KEY = "observation"
"""Metadata key of the observation's column names (comma-separated)."""


def policy_observation(env: ContextEnv) -> NDArray[np.float32]:
    """What the learned agent sees: the environment's observation of its current state (the
    one definition shared by training, the bus's decisions and evaluation)."""
    return observe(env.state, env.config)


def context_metadata(model: ActorCritic, features: tuple[str, ...]) -> dict[str, str]:
    """The metadata saved with a learned agent: the network's shape, the environment and its
    observation columns."""
    return model.architecture() | {"env": ENV_ID, FEATURES_KEY: ",".join(features)}


def check_features(meta: Mapping[str, str], features: tuple[str, ...], where: str) -> None:
    """:class:`ConfigError` unless the weights were trained on exactly ``features``."""
    saved = meta.get(FEATURES_KEY)
    if saved is None:
        raise ConfigError(f"{where}: weights name no {FEATURES_KEY!r} (not a Context-1 policy)")
    trained = tuple(saved.split(",")) if saved else ()
    if trained != features:
        missing = [f for f in features if f not in trained]
        extra = [f for f in trained if f not in features]
        raise ConfigError(
            f"{where}: trained on {len(trained)} observation columns, the environment has "
            f"{len(features)} (absent from the weights: {missing[:5]}, unknown here: {extra[:5]}); "
            "train it again for this environment"
        )


@dataclass(frozen=True, slots=True)
class LearnedPolicy:
    """A trained :class:`~podium.rl.networks.ActorCritic` as a Context-1 policy."""

    model: ActorCritic
    """The network (eval mode)."""
    features: tuple[str, ...]
    """Observation columns it was trained on (checked against each environment)."""
    name: str = "learned"
    """The policy's name in reports."""
    deterministic: bool = True
    """Greedy actions (evaluation); False samples (exploration, PPO's behaviour policy)."""
    source: str = ""
    """Where the weights came from (error messages)."""

    def act(self, env: ContextEnv) -> int:
        """The next action: the network's choice among the currently valid ones."""
        if env.features != self.features:
            check_features({FEATURES_KEY: ",".join(self.features)}, env.features, self.source)
        obs = torch.from_numpy(policy_observation(env)).unsqueeze(0)
        mask = torch.from_numpy(env.action_masks()).unsqueeze(0)
        with torch.inference_mode():
            action, _, _ = self.model.act(obs, mask, deterministic=self.deterministic)
        return int(action.item())


def save_learned_policy(
    model: ActorCritic, features: tuple[str, ...], root: str | Path, name: str, version: int
) -> ArtifactRef:
    """Write ``model`` as version ``version`` of ``name`` under ``root`` (the artifact
    layout, sidecar hash included) with the metadata :func:`load_learned_policy` checks."""
    return publish_weights(
        model.state_dict(), root, name, version, metadata=context_metadata(model, features)
    )


def weights_path(path: str | Path) -> Path:
    """The weights file ``path`` names: the file itself, or ``weights.safetensors`` in a
    version directory."""
    p = Path(path)
    return p / WEIGHTS_FILE if p.is_dir() else p


def load_learned_policy(
    path: str | Path, *, name: str = "learned", deterministic: bool = True
) -> LearnedPolicy:
    """The learned agent saved at ``path`` (a weights file or its version directory), its
    bytes verified against the sidecar sha256. A missing or corrupt file is an
    :class:`~podium.errors.ArtifactError`; weights of another network or environment a
    :class:`ConfigError`, both naming the file. Sets this process's torch threads to one
    (what an agent's decisions run fastest on)."""
    file = weights_path(path)
    weights = load_weights(file)
    meta, where = weights.metadata, str(file)
    if meta.get("env") != ENV_ID:
        raise ConfigError(f"{where}: weights are for {meta.get('env')!r}, not {ENV_ID}")
    model = ActorCritic.from_architecture(meta)
    if model.n_actions != ACTIONS.size:
        raise ConfigError(
            f"{where}: the network has {model.n_actions} actions, the environment {ACTIONS.size}"
        )
    features = tuple(meta.get(FEATURES_KEY, "").split(","))
    if model.obs_dim != len(features):
        raise ConfigError(
            f"{where}: the network reads {model.obs_dim} values but names {len(features)} columns"
        )
    load_into(model, weights)
    model.eval()
    # A decision is one forward pass of a small MLP: torch's intra-op threads only add
    # contention (measured on the 2-core machine: 8 questions/s/core with the default
    # threads, 51 with one; p99 1.5 s against 26 ms).
    torch.set_num_threads(1)
    return LearnedPolicy(model, features, name, deterministic, where)


__all__ = [
    "ENV_ID",
    "LearnedPolicy",
    "check_features",
    "context_metadata",
    "load_learned_policy",
    "policy_observation",
    "save_learned_policy",
    "weights_path",
]
