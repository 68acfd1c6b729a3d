"""The policy's serving signature: tensor names, shapes, dtypes, and their validation.

Every backend (in-process torch, a KServe-V2 server, Triton on GPUs) runs the same function::

    subtask_features  float32 [batch, n_subtasks, F]            one token per subtask
    subtask_mask      bool    [batch, n_subtasks]               True where the slot holds one
    global_features   float32 [batch, G]                        clock, capacity, running table
    pair_features     float32 [batch, n_subtasks, n_agents, P]  one row per (subtask, agent)
    action_mask       bool    [batch, N]                        N = n_subtasks · n_agents · 3 + 2
                                                                (START per subtask, agent and
                                                                split, then WAIT and FINISH)
    ->
    logits            float32 [batch, N]                        invalid entries a large
                                                                negative number
    value             float32 [batch]                           V(s)

``batch``, ``n_subtasks`` and ``n_agents`` are dynamic (``N`` follows them), so one exported
file serves tasks of any size on pools of any size: the network reads agents by their
features, never by position. This module needs numpy and protobuf (Triton's ``ModelConfig``),
never torch: the MLServer adapter and the CLI use it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from podium.envs.swarm.actions import CONTROL_ACTIONS, SPLIT_CHOICES, ActionCodec
from podium.errors import PodiumError
from podium.serving.pbtxt import TritonModelConfig, render_model_config

INPUT_NAMES = (
    "subtask_features",
    "subtask_mask",
    "global_features",
    "pair_features",
    "action_mask",
)
"""Input tensor names, in the order of the module's ``forward`` arguments."""
OUTPUT_NAMES = ("logits", "value")
"""Output tensor names, in the order ``forward`` returns them."""


class ObservationError(PodiumError):
    """An observation batch does not fit the policy's signature. ``field`` names the tensor."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class PolicySignature:
    """The sizes that are fixed for a given policy network (everything but batch, subtasks and
    agents)."""

    subtask_features: int
    """Features per subtask token F."""
    global_features: int
    """Global features G."""
    pair_features: int
    """Features per (subtask, agent) pair P."""

    def __post_init__(self) -> None:
        for name in ("subtask_features", "global_features", "pair_features"):
            if getattr(self, name) < 1:
                raise ObservationError(f"PolicySignature.{name} must be >= 1", field=name)

    def n_actions(self, n_subtasks: int, n_agents: int) -> int:
        """``N = n_subtasks · n_agents · 3 + 2``: the flat action count of a task of
        ``n_subtasks`` on a pool of ``n_agents``."""
        return n_subtasks * n_agents * SPLIT_CHOICES + CONTROL_ACTIONS


_DTYPES = {
    "subtask_features": np.float32,
    "subtask_mask": np.bool_,
    "global_features": np.float32,
    "pair_features": np.float32,
    "action_mask": np.bool_,
}
"""Every input's dtype, in :data:`INPUT_NAMES` order."""


@dataclass(frozen=True, slots=True)
class PolicyInputs:
    """One batch of observations in the serving layout (contiguous numpy arrays)."""

    subtask_features: NDArray[np.float32]
    """``[batch, n_subtasks, F]`` float32."""
    subtask_mask: NDArray[np.bool_]
    """``[batch, n_subtasks]`` bool."""
    global_features: NDArray[np.float32]
    """``[batch, G]`` float32."""
    pair_features: NDArray[np.float32]
    """``[batch, n_subtasks, n_agents, P]`` float32."""
    action_mask: NDArray[np.bool_]
    """``[batch, n_subtasks · n_agents · 3 + 2]`` bool."""

    @property
    def batch(self) -> int:
        """Observations in the batch."""
        return int(self.subtask_features.shape[0])

    @property
    def n_subtasks(self) -> int:
        """Subtask slots per observation."""
        return int(self.subtask_features.shape[1])

    @property
    def n_agents(self) -> int:
        """Agents of the pool the observations were made on (0 if ``pair_features`` is not
        4-dimensional; :meth:`validate` names that)."""
        shape = np.shape(self.pair_features)
        return int(shape[2]) if len(shape) == 4 else 0

    def arrays(self) -> dict[str, NDArray[np.generic]]:
        """Name -> array, in :data:`INPUT_NAMES` order."""
        return {name: getattr(self, name) for name in INPUT_NAMES}

    def validate(self, signature: PolicySignature) -> None:
        """Raise :class:`ObservationError` naming the first tensor that does not fit."""
        for name, dtype in _DTYPES.items():
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray):
                raise ObservationError(f"{name} must be a numpy array", field=name)
            if arr.dtype != dtype:
                raise ObservationError(
                    f"{name} has dtype {arr.dtype}, expected {np.dtype(dtype)}", field=name
                )
        sf = self.subtask_features
        if sf.ndim != 3 or sf.shape[2] != signature.subtask_features:
            raise ObservationError(
                f"subtask_features has shape {sf.shape}, expected "
                f"[batch, n_subtasks, {signature.subtask_features}]",
                field="subtask_features",
            )
        b, s = self.batch, self.n_subtasks
        if b < 1:
            raise ObservationError("the batch is empty", field="subtask_features")
        pf = self.pair_features
        if pf.ndim != 4 or pf.shape[:2] != (b, s) or pf.shape[3] != signature.pair_features:
            raise ObservationError(
                f"pair_features has shape {pf.shape}, expected [{b}, {s}, n_agents, "
                f"{signature.pair_features}] for batch {b} and {s} subtasks",
                field="pair_features",
            )
        a = self.n_agents
        if a < 1:
            raise ObservationError(
                "pair_features has no agents (the pool is empty)", field="pair_features"
            )
        shapes = {
            "subtask_mask": (b, s),
            "global_features": (b, signature.global_features),
            "action_mask": (b, signature.n_actions(s, a)),
        }
        for name, shape in shapes.items():
            actual = tuple(getattr(self, name).shape)
            if actual != shape:
                raise ObservationError(
                    f"{name} has shape {actual}, expected {shape} for batch {b}, {s} subtasks "
                    f"and {a} agents",
                    field=name,
                )
        if not self.action_mask.any(axis=1).all():
            row = int(np.flatnonzero(~self.action_mask.any(axis=1))[0])
            raise ObservationError(
                f"action_mask row {row} allows no action (every row needs at least one)",
                field="action_mask",
            )


@dataclass(frozen=True, slots=True)
class PolicyOutputs:
    """What a backend returns for a :class:`PolicyInputs` batch."""

    logits: NDArray[np.float32]
    """``[batch, A]`` masked logits."""
    value: NDArray[np.float32]
    """``[batch]`` state values."""
    version: str
    """Policy version that produced them (``"local"`` or the served model version)."""


def random_inputs(
    signature: PolicySignature,
    batch: int,
    n_subtasks: int,
    rng: np.random.Generator,
    *,
    n_agents: int = 3,
) -> PolicyInputs:
    """Random but well-formed observations (parity tests, benchmarks, export tracing).

    Each row has between one and all subtask slots present and a random action mask with WAIT
    always valid, as in the environment (waiting is always allowed while work runs). Pair
    features are standard normal, so about a third of the pairs read as ``can_do``.
    """
    if batch < 1 or n_subtasks < 1 or n_agents < 1:
        raise ObservationError(
            f"batch ({batch}), n_subtasks ({n_subtasks}) and n_agents ({n_agents}) must be >= 1"
        )
    features = rng.standard_normal((batch, n_subtasks, signature.subtask_features))
    present = rng.integers(1, n_subtasks + 1, size=batch)
    subtask_mask = np.arange(n_subtasks)[None, :] < present[:, None]
    globals_ = rng.standard_normal((batch, signature.global_features))
    pairs = rng.standard_normal((batch, n_subtasks, n_agents, signature.pair_features))
    k = n_agents * SPLIT_CHOICES
    starts = (rng.random((batch, n_subtasks, k)) < 0.5) & subtask_mask[:, :, None]
    control = np.ones((batch, CONTROL_ACTIONS), dtype=bool)
    control[:, 1] = rng.random(batch) < 0.5  # FINISH valid only sometimes
    action_mask = np.concatenate([starts.reshape(batch, n_subtasks * k), control], axis=1)
    return PolicyInputs(
        subtask_features=np.ascontiguousarray(features, dtype=np.float32),
        subtask_mask=np.ascontiguousarray(subtask_mask),
        global_features=np.ascontiguousarray(globals_, dtype=np.float32),
        pair_features=np.ascontiguousarray(pairs, dtype=np.float32),
        action_mask=np.ascontiguousarray(action_mask),
    )


def render_policy_config(
    name: str,
    signature: PolicySignature,
    *,
    max_batch_size: int = 256,
    gpu: bool = True,
    instances: int = 1,
    max_queue_delay_us: int = 200,
) -> str:
    """The Triton ``config.pbtxt`` of a policy model named ``name``.

    Built as Triton's own ``ModelConfig`` message and written with protobuf's text format
    (:mod:`podium.serving.pbtxt`), so every field is one Triton knows. ``gpu=True``
    (production) declares GPU instances with TensorRT as execution accelerator in fp16;
    onnxruntime falls back to its CUDA provider for any operator TensorRT cannot take.
    ``gpu=False`` declares CPU instances. MLServer's adapter reads the tensor declarations and
    version policy and ignores the GPU settings, so tests serve the production file unchanged.

    ``value`` is ``[batch]`` in the ONNX graph; Triton requires every non-batch tensor to have
    at least one dimension, so the config declares ``dims: [1]`` with an empty ``reshape``
    (Triton's documented form for a per-item scalar). Clients then read ``value`` as
    ``[batch, 1]`` from Triton and ``[batch]`` from MLServer; :mod:`podium.serving.backends`
    flattens both.
    """
    if max_batch_size < 1:
        raise ObservationError("max_batch_size must be >= 1 (the policy batches on axis 0)")
    message = policy_model_config(
        name,
        signature,
        max_batch_size=max_batch_size,
        gpu=gpu,
        instances=instances,
        max_queue_delay_us=max_queue_delay_us,
    )
    return render_model_config(message, _CONFIG_COMMENTS + (_GPU_COMMENTS if gpu else ()))


_CONFIG_COMMENTS = (
    "Written by podium.serving.contract.render_policy_config: Triton's ModelConfig in",
    "protobuf text format. value is [batch] in the graph; Triton needs a non-batch",
    "dimension, hence dims [1] with an empty reshape. dynamic_batching: requests with the",
    "same numbers of subtasks and agents are batched together.",
)
"""Header of every rendered config: the reasons the text format has no place for."""

_GPU_COMMENTS = (
    "GPU path: TensorRT execution accelerator in fp16. fp16 arithmetic moves logits by far",
    "more than the 1e-4 fp32 parity tolerance, which is a CPU (fp32) guarantee. LayerNorm",
    "stays fp32 inside the engine (it overflows in fp16). Engines are built per input shape",
    "and cached across restarts at /cache/tensorrt (a volume in k8s/overlays/prod/gpu.yaml).",
)
"""Header lines added on the GPU path."""

_TRT_PARAMETERS = {
    "precision_mode": "FP16",
    "max_workspace_size_bytes": "1073741824",
    "trt_layer_norm_fp32_fallback": "1",
    "trt_engine_cache_enable": "1",
    "trt_engine_cache_path": "/cache/tensorrt",
}
"""onnxruntime's TensorRT execution accelerator settings on the GPU path (see the header)."""


def policy_model_config(
    name: str,
    signature: PolicySignature,
    *,
    max_batch_size: int,
    gpu: bool,
    instances: int,
    max_queue_delay_us: int,
) -> Any:
    """Triton's ``ModelConfig`` message of a policy model (see :func:`render_policy_config`)."""
    f, g, p = signature.subtask_features, signature.global_features, signature.pair_features
    config = TritonModelConfig(
        name=name,
        platform="onnxruntime_onnx",
        max_batch_size=max_batch_size,
    )
    config.version_policy.latest.num_versions = 1
    for tensor, dtype, dims in (
        ("subtask_features", "TYPE_FP32", [-1, f]),
        ("subtask_mask", "TYPE_BOOL", [-1]),
        ("global_features", "TYPE_FP32", [g]),
        ("pair_features", "TYPE_FP32", [-1, -1, p]),
        ("action_mask", "TYPE_BOOL", [-1]),
    ):
        config.input.add(name=tensor, data_type=dtype, dims=dims)
    config.output.add(name="logits", data_type="TYPE_FP32", dims=[-1])
    config.output.add(name="value", data_type="TYPE_FP32", dims=[1]).reshape.SetInParent()
    config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    config.instance_group.add(count=instances, kind="KIND_GPU" if gpu else "KIND_CPU")
    if gpu:
        accelerators = config.optimization.execution_accelerators
        tensorrt = accelerators.gpu_execution_accelerator.add(name="tensorrt")
        tensorrt.parameters.update(_TRT_PARAMETERS)
    return config


def stack_padded(batches: list[PolicyInputs], signature: PolicySignature) -> PolicyInputs:
    """Concatenate observation batches of different task and pool sizes into one padded batch.

    Many sessions decide at once but their tasks differ in size, and their pools may too; one
    call for all of them needs one ``n_subtasks`` and one ``n_agents``. Shorter rows are padded
    with absent subtasks (``subtask_mask`` False, features zero) and absent agents (pair rows
    zero, so ``can_do`` 0), whose actions are all invalid; each START keeps its (subtask,
    agent, split) at the padded layout's index, and WAIT/FINISH move to the end. The network
    ignores absent subtasks (masked attention) and absent agents (its cross-agent mean reads
    only agents that can do a subtask), so a padded row decides as it would alone;
    :func:`unstack_padded` maps the outputs back.
    """
    if not batches:
        raise ObservationError("stack_padded needs at least one batch")
    for b in batches:
        b.validate(signature)
    s_max = max(b.n_subtasks for b in batches)
    a_max = max(b.n_agents for b in batches)
    rows = sum(b.batch for b in batches)
    features = np.zeros((rows, s_max, signature.subtask_features), dtype=np.float32)
    subtask_mask = np.zeros((rows, s_max), dtype=bool)
    pairs = np.zeros((rows, s_max, a_max, signature.pair_features), dtype=np.float32)
    action_mask = np.zeros((rows, signature.n_actions(s_max, a_max)), dtype=bool)
    padded = ActionCodec(s_max, a_max)
    r = 0
    for b in batches:
        s, a, n = b.n_subtasks, b.n_agents, b.batch
        features[r : r + n, :s] = b.subtask_features
        subtask_mask[r : r + n, :s] = b.subtask_mask
        pairs[r : r + n, :s, :a] = b.pair_features
        ActionCodec(s, a).translate_mask_to(b.action_mask, padded, out=action_mask[r : r + n])
        r += n
    return PolicyInputs(
        subtask_features=features,
        subtask_mask=subtask_mask,
        global_features=np.concatenate([b.global_features for b in batches]),
        pair_features=pairs,
        action_mask=action_mask,
    )


def unstack_padded(
    outputs: PolicyOutputs, batches: list[PolicyInputs], signature: PolicySignature
) -> list[PolicyOutputs]:
    """Split the outputs of a :func:`stack_padded` batch back into each batch's own layout."""
    s_max = max(b.n_subtasks for b in batches)
    a_max = max(b.n_agents for b in batches)
    expected = (sum(b.batch for b in batches), signature.n_actions(s_max, a_max))
    if tuple(outputs.logits.shape) != expected:
        raise ObservationError(
            f"logits have shape {tuple(outputs.logits.shape)}, expected {expected} for the "
            "stacked batches",
            field="logits",
        )
    padded = ActionCodec(s_max, a_max)
    out: list[PolicyOutputs] = []
    r = 0
    for b in batches:
        n = b.batch
        own = ActionCodec(b.n_subtasks, b.n_agents)
        logits = padded.translate_mask_to(outputs.logits[r : r + n], own)
        out.append(PolicyOutputs(logits, outputs.value[r : r + n], outputs.version))
        r += n
    return out
