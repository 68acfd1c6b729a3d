"""MLServer adapter: serve a Triton model repository of ONNX files with onnxruntime.

Runs inside MLServer's own virtual environment (``scripts/v2server.sh``), never in the
project's: it imports only ``mlserver``, ``onnxruntime``, ``numpy`` and the torch-free parts
of ``podium`` (:mod:`podium.serving.pbtxt`, which reads ``config.pbtxt`` as Triton's
``ModelConfig`` with the ``tritonclient`` MLServer itself depends on; :mod:`podium.errors`).

The Triton layout stays the single source of truth: MLServer normally discovers models by
``model-settings.json`` files, but it accepts a pluggable repository class
(``MLSERVER_MODEL_REPOSITORY_IMPLEMENTATION``). :class:`TritonModelRepository` reads
``<root>/<model>/config.pbtxt`` and translates each model into MLServer ``ModelSettings`` in
memory when the server lists or loads it, so nothing is generated on disk and nothing can go
stale.

Versions and hot swap. A Triton client loads a new version with ``RepositoryModelLoad(name)``:
the server re-reads the repository and serves the newest version(s) its version policy
selects. MLServer's registry, given a settings object *with* a new version number, registers
the new version as the default *before* loading it, so requests without an explicit version
fail with "not ready" during the load. Given the same (unversioned) settings again, it instead
loads the new object first and swaps it in afterwards, keeping the old one serving until then
(and keeping it if the load fails). So the repository presents each model unversioned, and
:class:`OnnxPolicyModel` picks the version itself from the Triton policy at load time and
reports it in every response's ``model_version`` and in the model metadata, as Triton does.
Consequence: with ``latest { num_versions: N > 1 }`` only the newest version is served;
requests naming an explicit version are not supported by this adapter (Podium never sends one).
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from mlserver import MLModel  # type: ignore[import-not-found,unused-ignore]
from mlserver.errors import MLServerError, ModelNotFound  # type: ignore[import-not-found,unused-ignore]
from mlserver.logging import logger as log  # type: ignore[import-not-found,unused-ignore]
from mlserver.repository import ModelRepository  # type: ignore[import-not-found,unused-ignore]
from mlserver.settings import ModelParameters, ModelSettings  # type: ignore[import-not-found,unused-ignore]
from mlserver.types import (  # type: ignore[import-not-found,unused-ignore]
    InferenceRequest,
    InferenceResponse,
    MetadataModelResponse,
    MetadataTensor,
    ResponseOutput,
)

from podium.errors import ConfigError
from podium.serving.pbtxt import CONFIG_FILE, ModelConfig, read_model_config, version_dirs

PLATFORM = "onnxruntime_onnx"
"""The only Triton platform this adapter serves."""
_UNPROCESSABLE = 422
"""HTTP status MLServer maps to gRPC FAILED_PRECONDITION: the request was fine, the model is not."""

_NUMPY_TO_V2 = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}
_V2_TO_NUMPY = {v: k for k, v in _NUMPY_TO_V2.items()}


def _settings_for(model_dir: Path, config: ModelConfig) -> Any:
    """MLServer settings of one Triton model (unversioned on purpose; see the module doc)."""
    return ModelSettings(
        name=config.name,
        platform=config.platform,
        implementation=OnnxPolicyModel,
        parameters=ModelParameters(uri=str(model_dir)),
    )


def _read_config(model_dir: Path) -> ModelConfig:
    try:
        return read_model_config(model_dir)
    except ConfigError as exc:
        raise MLServerError(str(exc), _UNPROCESSABLE) from None


class TritonModelRepository(ModelRepository):  # type: ignore[misc]
    """MLServer's model repository over a Triton layout (``<root>/<model>/config.pbtxt``)."""

    def __init__(self, root: str, **_: Any) -> None:
        self._root = Path(root).resolve()

    async def list(self) -> list[Any]:
        """Settings of every model with a readable config (bad ones are logged and skipped)."""
        out = []
        for config_path in sorted(self._root.glob(f"*/{CONFIG_FILE}")):
            try:
                out.append(_settings_for(config_path.parent, read_model_config(config_path.parent)))
            except ConfigError as exc:
                log.error("skipping %s: %s", config_path.parent, exc)
        return out

    async def find(self, name: str) -> builtins.list[Any]:
        """Settings of model ``name``; a broken config is an error naming the file."""
        model_dir = self._root / name
        if "/" in name or not (model_dir / CONFIG_FILE).is_file():
            raise ModelNotFound(name)
        return [_settings_for(model_dir, _read_config(model_dir))]


def _verify_sidecar(path: Path) -> None:
    """If ``<path>.sha256`` exists (the exporter writes one), the file must match it."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.exists():
        return
    expected = sidecar.read_text().split()[0].lower() if sidecar.read_text().strip() else ""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != expected:
        raise MLServerError(
            f"{path}: sha256 mismatch, expected {expected}, actual {h.hexdigest()} "
            "(file corrupt or tampered with; refusing to load it)",
            _UNPROCESSABLE,
        )


def _open_session(path: Path, config: ModelConfig) -> ort.InferenceSession:
    """Load and check one ONNX file; every failure names the file."""
    if not path.is_file():
        raise MLServerError(f"{path}: model file not found", _UNPROCESSABLE)
    _verify_sidecar(path)
    options = ort.SessionOptions()
    # One thread per request: decisions are small and the server shares a 2-core machine.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime's InvalidProtobuf / Fail / InvalidGraph
        raise MLServerError(f"{path}: onnxruntime cannot load it: {exc}", _UNPROCESSABLE) from None
    declared = {t.name for t in config.inputs}, {t.name for t in config.outputs}
    actual = {i.name for i in session.get_inputs()}, {o.name for o in session.get_outputs()}
    for kind, want, have in zip(("inputs", "outputs"), declared, actual, strict=True):
        if want and want != have:
            raise MLServerError(
                f"{path}: graph {kind} {sorted(have)} differ from {CONFIG_FILE}'s {sorted(want)}",
                _UNPROCESSABLE,
            )
    return session


class OnnxPolicyModel(MLModel):  # type: ignore[misc]
    """One Triton model served with onnxruntime on CPU, at the version its policy selects."""

    _session: ort.InferenceSession | None = None
    _version: int = 0
    _path: Path | None = None
    _config: ModelConfig | None = None

    async def load(self) -> bool:
        """Pick the version, open and check the file (off the event loop, so serving goes on)."""
        model_dir = Path(self.settings.parameters.uri)
        config = _read_config(model_dir)
        if config.platform != PLATFORM:
            raise MLServerError(
                f"{model_dir / CONFIG_FILE}: platform {config.platform!r} is not served by "
                f"this adapter (only {PLATFORM!r})",
                _UNPROCESSABLE,
            )
        versions = config.versions_to_serve(version_dirs(model_dir))
        if not versions:
            raise MLServerError(
                f"{model_dir}: no numeric version directory for the version policy to serve",
                _UNPROCESSABLE,
            )
        version = versions[0]
        path = model_dir / str(version) / config.default_model_filename
        session = await asyncio.to_thread(_open_session, path, config)
        self._session, self._version, self._path, self._config = session, version, path, config
        log.info("model %s: serving version %d from %s", config.name, version, path)
        return True

    async def unload(self) -> bool:
        """Drop the session; requests already running keep their own reference to it."""
        self._session = None
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        """Run the graph on the request's tensors; outputs keep the graph's shapes."""
        session, path = self._session, self._path
        if session is None:
            raise MLServerError(f"model {self.name} is not loaded", 400)
        feeds: dict[str, np.ndarray] = {}
        for tensor in payload.inputs:
            dtype = _V2_TO_NUMPY.get(tensor.datatype)
            if dtype is None:
                raise MLServerError(f"input {tensor.name}: unsupported datatype {tensor.datatype}")
            data = getattr(tensor.data, "root", tensor.data)
            feeds[tensor.name] = np.asarray(data, dtype=dtype).reshape(tensor.shape)
        wanted = [o.name for o in payload.outputs] if payload.outputs else None
        try:
            results = session.run(wanted, feeds)
        except Exception as exc:  # onnxruntime reports bad shapes/names as InvalidArgument
            raise MLServerError(f"{path}: inference failed: {exc}", 400) from None
        names = wanted or [o.name for o in session.get_outputs()]
        outputs = [
            ResponseOutput(
                name=name,
                datatype=_NUMPY_TO_V2[arr.dtype],
                shape=list(arr.shape),
                data=arr.reshape(-1).tolist(),
            )
            for name, arr in zip(names, results, strict=True)
        ]
        return InferenceResponse(
            model_name=self.name, model_version=str(self._version), outputs=outputs
        )

    async def metadata(self) -> MetadataModelResponse:
        """Name, the served version and the tensors as declared in ``config.pbtxt``."""
        config = self._config
        batch = [-1] if config is not None and config.max_batch_size > 0 else []
        tensors = (config.inputs, config.outputs) if config is not None else ((), ())
        return MetadataModelResponse(
            name=self.name,
            platform=PLATFORM,
            versions=[str(self._version)] if self._version else [],
            inputs=[
                MetadataTensor(name=t.name, datatype=t.data_type, shape=batch + list(t.dims))
                for t in tensors[0]
            ],
            outputs=[
                MetadataTensor(name=t.name, datatype=t.data_type, shape=batch + list(t.dims))
                for t in tensors[1]
            ],
        )
