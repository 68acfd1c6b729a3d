"""Export a policy module to ONNX into a Triton model repository.

Layout written (Triton's, and the one the MLServer adapter reads)::

    <repository>/<model>/config.pbtxt              written once; checked on later exports
    <repository>/<model>/<version>/model.onnx      one per published version
    <repository>/<model>/<version>/model.onnx.sha256

The file is exported to a temporary name in the version directory, checked (``onnx.checker``,
then onnxruntime against torch on a batch and task size *different* from the traced ones, so a
shape accidentally baked in at trace time is caught here, not in production), and only then
moved to ``model.onnx`` with :func:`os.replace`. A server told to load the version therefore
never sees a half-written or unchecked file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from podium.errors import ArtifactError
from podium.serving.contract import (
    INPUT_NAMES,
    OUTPUT_NAMES,
    PolicyInputs,
    PolicySignature,
    random_inputs,
    render_policy_config,
)
from podium.serving.pbtxt import CONFIG_FILE, model_config_from_text

if TYPE_CHECKING:
    from podium.envs.swarm.observation import ObservationLayout

MODEL_FILE = "model.onnx"
"""File name of the model inside a version directory (Triton's default for ONNX)."""
OPSET = 17
"""ONNX opset: LayerNormalization is a single op from 17 on; Triton 23.x+ runs it."""
_FILE_MODE = 0o644
"""Mode of written files: mkstemp's 0600 would hide them from a server running as another user
(Triton runs as uid 1000, the learner that exports as another)."""
EXPORT_TOLERANCE = 1e-4
"""Largest |onnxruntime - torch| accepted on the post-export check (the parity contract)."""


@dataclass(frozen=True, slots=True)
class ExportedModel:
    """A version written into the repository."""

    path: Path
    """The ``model.onnx`` file."""
    version: int
    """Its version number."""
    sha256: str
    """Hex sha256 of the file."""
    max_abs_error: float
    """Largest |onnxruntime - torch| over logits and value on the check batch."""


def torch_forward(module: nn.Module, inputs: PolicyInputs) -> tuple[np.ndarray, np.ndarray]:
    """Run ``module`` on ``inputs`` with torch; returns (logits, value) as float32 numpy."""
    with torch.inference_mode():
        logits, value = module(*(torch.from_numpy(a) for a in inputs.arrays().values()))
    return logits.numpy().astype(np.float32), value.numpy().astype(np.float32)


def swarm_signature(layout: ObservationLayout) -> PolicySignature:
    """The serving signature of a swarm environment's observation layout: its slot, global
    token and pair widths, none of which depends on the pool (agents are a dynamic axis)."""
    return PolicySignature(
        subtask_features=layout.slot_features,
        global_features=layout.global_token_features,
        pair_features=layout.pair_features,
    )


def default_swarm_signature() -> PolicySignature:
    """Signature of the swarm environment's default layout (the committed config): any pool's,
    since no width depends on the pool."""
    from podium.envs.swarm import SwarmEnv, default_tasks

    return swarm_signature(SwarmEnv(default_tasks()[0]).layout)


def onnx_session(path: Path, threads: int = 1) -> ort.InferenceSession:
    """A CPU onnxruntime session on ``path``; :class:`ArtifactError` naming it if unloadable."""
    options = ort.SessionOptions()
    # One intra-op thread: policy decisions are small, and thread hand-offs cost more than
    # they save (and the machines running tests have two cores shared by everything).
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf types
        raise ArtifactError(f"{path}: onnxruntime cannot load it: {exc}") from None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_model_config(
    repository: Path, model_name: str, signature: PolicySignature, *, gpu: bool = True
) -> Path:
    """Write ``<repository>/<model>/config.pbtxt`` if absent; check it if present.

    An existing file may carry operator edits (instance counts, queue delays), so it is never
    overwritten; but if its tensor declarations no longer match the signature (a network of
    another size), serving it would fail at load time, so that is an :class:`ArtifactError`.
    """
    model_dir = repository / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / CONFIG_FILE
    expected = model_config_from_text(
        render_policy_config(model_name, signature, gpu=gpu), str(path)
    )
    if not path.exists():
        _atomic_write_text(path, render_policy_config(model_name, signature, gpu=gpu))
        return path
    actual = model_config_from_text(path.read_text(), str(path))
    if actual.name != model_name:
        raise ArtifactError(f"{path}: name is {actual.name!r}, expected {model_name!r}")
    for kind, want, have in (
        ("input", expected.inputs, actual.inputs),
        ("output", expected.outputs, actual.outputs),
    ):
        if {(t.name, t.data_type, t.dims) for t in want} != {
            (t.name, t.data_type, t.dims) for t in have
        }:
            raise ArtifactError(
                f"{path}: {kind} declarations do not match the policy signature {signature} "
                f"(expected {[(t.name, t.data_type, t.dims) for t in want]}); "
                "delete the file to regenerate it or fix it by hand"
            )
    return path


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_policy(
    module: nn.Module,
    signature: PolicySignature,
    repository: str | Path,
    model_name: str,
    version: int,
    *,
    gpu_config: bool = True,
    seed: int = 0,
) -> ExportedModel:
    """Export ``module`` as version ``version`` of ``model_name`` into ``repository``.

    ``module.forward(subtask_features, subtask_mask, global_features, pair_features,
    action_mask)`` must return ``(logits, value)`` (see :mod:`podium.serving.contract`); the
    batch, subtask and agent axes are exported dynamic, and the check runs on other sizes of
    all three than the traced ones. Versions are immutable:
    exporting over an existing ``model.onnx`` raises :class:`ArtifactError`.
    """
    if version < 1:
        # Triton ignores version directory 0 in its default policies' ordering sense and
        # rejects non-positive versions on explicit load, so versions start at 1.
        raise ArtifactError(f"invalid version {version} for {model_name} (must be >= 1)")
    if not model_name or "/" in model_name or model_name.startswith("."):
        raise ArtifactError(f"invalid model name {model_name!r}")
    repo = Path(repository).resolve()
    ensure_model_config(repo, model_name, signature, gpu=gpu_config)
    version_dir = repo / model_name / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    final = version_dir / MODEL_FILE
    if final.exists():
        raise ArtifactError(
            f"{final} already exists; versions are immutable, publish a new version number"
        )
    was_training = module.training
    module.eval()
    rng = np.random.default_rng(seed)
    trace = random_inputs(signature, batch=2, n_subtasks=3, rng=rng, n_agents=2)
    args = tuple(torch.from_numpy(a) for a in trace.arrays().values())
    dynamic_axes = {
        "subtask_features": {0: "batch", 1: "n_subtasks"},
        "subtask_mask": {0: "batch", 1: "n_subtasks"},
        "global_features": {0: "batch"},
        "pair_features": {0: "batch", 1: "n_subtasks", 2: "n_agents"},
        "action_mask": {0: "batch", 1: "n_actions"},
        "logits": {0: "batch", 1: "n_actions"},
        "value": {0: "batch"},
    }
    fd, tmp_name = tempfile.mkstemp(prefix=".model.", suffix=".onnx.tmp", dir=version_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            # The TorchScript exporter: it needs no onnxscript, handles named dynamic axes,
            # and writes one self-contained file (the dynamo exporter may split weights out).
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(tmp),
                input_names=list(INPUT_NAMES),
                output_names=list(OUTPUT_NAMES),
                dynamic_axes=dynamic_axes,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as exc:
            raise ArtifactError(f"{final}: exported graph fails onnx.checker: {exc}") from None
        check = random_inputs(signature, batch=5, n_subtasks=7, rng=rng, n_agents=5)
        session = onnx_session(tmp)
        got = session.run(list(OUTPUT_NAMES), check.arrays())
        want = torch_forward(module, check)
        error = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
        if not error <= EXPORT_TOLERANCE:
            raise ArtifactError(
                f"{final}: onnxruntime differs from torch by {error:.3g} "
                f"(> {EXPORT_TOLERANCE}) on batch 5 x 7 subtasks x 5 agents; not publishing it"
            )
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
        module.train(was_training)
    digest = _sha256(final)
    _atomic_write_text(final.with_name(MODEL_FILE + ".sha256"), f"{digest}  {MODEL_FILE}\n")
    return ExportedModel(path=final, version=version, sha256=digest, max_abs_error=error)


def main(argv: list[str] | None = None) -> int:
    """``python -m podium.serving.export ensure-config --repository DIR [--model NAME]``.

    Writes (or checks) the model's ``config.pbtxt`` for the swarm environment (any pool):
    what the Triton Deployment's init container runs on a fresh model volume.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m podium.serving.export")
    sub = parser.add_subparsers(dest="action", required=True)
    ensure = sub.add_parser(
        "ensure-config", help="write or check <repository>/<model>/config.pbtxt"
    )
    ensure.add_argument("--repository", type=Path, required=True)
    ensure.add_argument("--model", default="swarm_policy")
    ensure.add_argument(
        "--cpu", action="store_true", help="declare CPU instances, not GPU+TensorRT"
    )
    args = parser.parse_args(argv)
    try:
        path = ensure_model_config(
            args.repository.resolve(), args.model, default_swarm_signature(), gpu=not args.cpu
        )
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
