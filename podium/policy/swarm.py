"""A trained orchestrator policy as a file, and as a scheduling policy like the rule engines.

Weights are safetensors written by :func:`podium.policy.artifacts.publish_weights` (sha256
sidecar, verified on load, never unpickled); the network's shape travels in the file's
metadata. The network reads agents by their features (:mod:`podium.policy.network`), so a
policy decides on any pool; the names of the pool it was trained on travel in the metadata
too, for reports only. A checkpoint of the pool-specific network that came before (its
metadata has ``num_agents``) is refused with an :class:`ArtifactError` that says to retrain:
its observation no longer exists.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from podium.envs.swarm import PolicyStep, Rng, SwarmEnv
from podium.envs.swarm.observation import ObservationLayout
from podium.errors import ArtifactError
from podium.policy.agent import SwarmAgent, guard_mask
from podium.policy.artifacts import (
    WEIGHTS_FILE,
    ArtifactRef,
    LoadedWeights,
    load_weights,
    publish_weights,
)
from podium.policy.network import NetworkConfig, SwarmPolicyNet
from podium.policy.versions import is_version_number

if TYPE_CHECKING:
    from podium.serving.contract import PolicySignature
    from podium.serving.export import ExportedModel
    from podium.v1.reward_pb2 import PolicyUpdated

MODEL_NAME = "swarm_policy"
"""Model name of the orchestrator policy in artifact roots and the Triton repository."""


def save_policy(
    net: SwarmPolicyNet, root: str | Path, version: int, agents: tuple[str, ...], **extra: str
) -> ArtifactRef:
    """Publish ``net`` as version ``version`` under ``root/swarm_policy/<version>/``; ``agents``:
    the names of the pool it was trained on (reported, never checked)."""
    meta = {
        "network": json.dumps(net.config.to_dict(), sort_keys=True),
        "agents": json.dumps(list(agents)),
        "kind": "podium.swarm_policy",
        **extra,
    }
    return publish_weights(net.state_dict(), root, MODEL_NAME, version, metadata=meta)


def serving_signature(net: SwarmPolicyNet) -> PolicySignature:
    """The serving signature of ``net`` (:mod:`podium.serving.contract`): its token, global and
    pair widths (subtasks and agents are dynamic)."""
    from podium.serving.contract import PolicySignature

    cfg = net.config
    return PolicySignature(
        subtask_features=cfg.slot_features,
        global_features=cfg.global_features,
        pair_features=cfg.pair_features,
    )


def layout_signature(layout: ObservationLayout) -> PolicySignature:
    """The serving signature every policy for an environment ``layout`` must accept: what a
    served orchestrator checks each request against."""
    from podium.serving.export import swarm_signature

    return swarm_signature(layout)


def export_swarm_policy(net: SwarmPolicyNet, repository: str | Path, version: int) -> ExportedModel:
    """Export ``net`` as ``<repository>/swarm_policy/<version>/model.onnx`` (Triton layout).

    Idempotent for the same weights, as :func:`save_policy` is: a learner that crashed after
    exporting re-publishes the version it restored, so an existing file is accepted when its
    sidecar hash matches its bytes and onnxruntime on it agrees with ``net`` within the export
    tolerance; any other existing file is an :class:`ArtifactError` (versions are immutable).
    Versions start at 1 (Triton's rule), so version 0, the learner's starting weights, has no
    export. Imports onnx and onnxruntime only when called.
    """
    from podium.policy.artifacts import read_sidecar_hash, sha256_file
    from podium.serving.contract import random_inputs
    from podium.serving.export import (
        EXPORT_TOLERANCE,
        MODEL_FILE,
        ExportedModel,
        export_policy,
        onnx_session,
        torch_forward,
    )

    signature = serving_signature(net)
    path = Path(repository).resolve() / MODEL_NAME / str(version) / MODEL_FILE
    if not path.exists():
        return export_policy(net, signature, repository, MODEL_NAME, version)
    digest = sha256_file(path)
    if read_sidecar_hash(path) != digest:
        raise ArtifactError(f"{path}: bytes do not match {path.name}.sha256 (corrupt export)")
    check = random_inputs(
        signature, batch=3, n_subtasks=5, rng=np.random.default_rng(version), n_agents=4
    )
    got = onnx_session(path).run(None, check.arrays())
    was_training = net.training
    net.eval()
    try:
        want = torch_forward(net, check)
    finally:
        net.train(was_training)
    error = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    if not error <= EXPORT_TOLERANCE:
        raise ArtifactError(
            f"{path} already exists with other weights (|difference| {error:.3g}); versions "
            "are immutable, publish a new version number"
        )
    return ExportedModel(path=path, version=version, sha256=digest, max_abs_error=error)


def swarm_policy_updated(
    ref: ArtifactRef,
    exported: ExportedModel | None = None,
    metrics: dict[str, float] | None = None,
) -> PolicyUpdated:
    """The ``PolicyUpdated`` event of a published version: its weights (``uri``, ``sha256``)
    and, when it was exported to the model repository, its ONNX file (``onnx_uri``,
    ``onnx_sha256``), which served orchestrators verify and load."""
    from podium.v1.reward_pb2 import PolicyUpdated

    event = PolicyUpdated(
        model_name=MODEL_NAME,
        version=ref.version,
        uri=ref.uri,
        sha256=ref.sha256,
        metrics=metrics or {},
    )
    if exported is not None:
        event.onnx_uri = exported.path.as_uri()
        event.onnx_sha256 = exported.sha256
    return event


def load_policy(
    path: str | Path, sha256: str | None = None
) -> tuple[SwarmPolicyNet, tuple[str, ...]]:
    """Load and verify a policy file; returns the network (eval mode) and the names of the pool
    it was trained on (for reports)."""
    return build_swarm_policy(load_weights(path, sha256))


def build_swarm_policy(weights: LoadedWeights) -> tuple[SwarmPolicyNet, tuple[str, ...]]:
    """The network (eval mode) and its training pool's agent names from verified weights
    (the ``build`` function of a :class:`~podium.policy.holder.PolicyHolder`)."""
    path = weights.path
    meta = weights.metadata
    if meta.get("kind") != "podium.swarm_policy":
        raise ArtifactError(f"{path}: not a swarm policy (metadata kind {meta.get('kind')!r})")
    try:
        shape = json.loads(meta["network"])
        agents = tuple(json.loads(meta["agents"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: policy metadata is incomplete ({exc})") from None
    cfg = network_config(shape, path)
    net = SwarmPolicyNet(cfg)
    try:
        net.load_state_dict(weights.tensors, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(
            f"{path}: weights do not fit the network in its metadata ({exc})"
        ) from None
    net.eval()
    return net, agents


def network_config(shape: object, path: str | Path) -> NetworkConfig:
    """The :class:`NetworkConfig` of a checkpoint's ``network`` metadata; :class:`ArtifactError`
    for anything else, and for a checkpoint of the pool-specific network (``num_agents``, no
    ``pair_features``), whose observation no longer exists: it must be retrained."""
    if not isinstance(shape, dict):
        raise ArtifactError(f"{path}: policy metadata 'network' is not an object: {shape!r}")
    if "num_agents" in shape or "pair_features" not in shape:
        raise ArtifactError(
            f"{path}: a policy of the pool-specific network (num_agents="
            f"{shape.get('num_agents')!r}, no pair features); the observation has changed "
            "since (agents are read by features), so it cannot run: retrain it (podium train)"
        )
    try:
        return NetworkConfig(**shape)
    except TypeError as exc:
        raise ArtifactError(f"{path}: policy metadata 'network' is invalid ({exc})") from None


MAX_SUBTASKS_KEY = "max_subtasks"
"""Policy metadata key: the environment's slot count S the policy was trained with (the
running-table features are scaled by it, so its sessions must use the same S)."""


def policy_max_subtasks(weights: LoadedWeights, default: int) -> int:
    """The slot count S a version was trained with (its ``max_subtasks`` metadata; ``default``
    for files that do not say); :class:`ArtifactError` when the metadata is not a count."""
    raw = weights.metadata.get(MAX_SUBTASKS_KEY, "")
    if not raw:
        return default
    if not is_version_number(raw) or int(raw) < 1:  # a bare ASCII count, as versions are
        raise ArtifactError(f"{weights.path}: metadata {MAX_SUBTASKS_KEY}={raw!r} is not a count")
    return int(raw)


def resolve_checkpoint(path: str | Path) -> Path:
    """A policy file from a path that may be the file, a version directory, or a run directory
    (then the newest version of its ``checkpoints/``, or its ``policy.safetensors``)."""
    p = Path(path)
    if p.is_file():
        return p
    for candidate in (p / "policy.safetensors", p / "final" / "policy.safetensors"):
        if candidate.is_file():
            return candidate
    versions = sorted(
        (
            int(d.name)
            for d in (p / "checkpoints" / MODEL_NAME).glob("*")
            if is_version_number(d.name) and (d / WEIGHTS_FILE).is_file()
        ),
    )
    if versions:
        return p / "checkpoints" / MODEL_NAME / str(versions[-1]) / WEIGHTS_FILE
    # Anything else: the newest file written, never the alphabetically last ("9" > "10").
    found = sorted(p.glob("**/*.safetensors"), key=lambda f: f.stat().st_mtime)
    if not found:
        raise ArtifactError(f"no policy checkpoint (*.safetensors) under {p}")
    return found[-1]


class LearnedPolicy:
    """A trained network as a :class:`~podium.envs.swarm.scheduling.SchedulingPolicy`, like
    the rule engines (benchmarks, evaluation), on any pool.

    Greedy (argmax) by default: evaluation and serving take the policy's best action.
    """

    name = "learned"

    def __init__(
        self,
        net: SwarmPolicyNet,
        agents: tuple[str, ...] = (),
        *,
        greedy: bool = True,
        version: str = "learned",
    ) -> None:
        self.net = net
        self.agents = agents
        """Names of the pool it was trained on (reports only: it decides on any pool)."""
        self.greedy = greedy
        self.version = version
        """Stamped on its decisions: the checkpoint it was loaded from, when known."""
        self._agents_by_layout: dict[ObservationLayout, SwarmAgent] = {}

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> LearnedPolicy:
        """Load ``path`` (see :func:`resolve_checkpoint`)."""
        resolved = resolve_checkpoint(path)
        net, agents = load_policy(resolved)
        return cls(net, agents, version=str(resolved))

    def agent_for(self, env: SwarmEnv) -> SwarmAgent:
        """The network bound to ``env``'s observation layout (any pool)."""
        agent = self._agents_by_layout.get(env.layout)
        if agent is None:
            agent = SwarmAgent(env.layout, net=self.net)
            self._agents_by_layout[env.layout] = agent
        return agent

    def act(self, env: SwarmEnv, rng: Rng = None) -> PolicyStep:
        """One decision for the env's current state (sampling draws its seed from ``rng``)."""
        agent = self.agent_for(env)
        obs = env.observation()[None, :]
        mask = guard_mask(env.state, env.action_masks(), env.codec)[None, :]
        gen = None
        if not self.greedy:
            seed = rng.getrandbits(63) if isinstance(rng, random.Random) else 0
            gen = torch.Generator().manual_seed(seed)
        res = agent.act(
            np.array(obs, dtype=np.float32),  # a writable copy of the env's read-only view
            mask,
            len(env.task.subtasks),
            greedy=self.greedy,
            generator=gen,
        )
        return PolicyStep(int(res.actions[0]), float(res.log_probs[0]), float(res.values[0]))
