"""Triton ``config.pbtxt``: Triton's own ``ModelConfig`` message, in protobuf text format.

Triton's model configuration is the ``inference.ModelConfig`` protobuf (Triton's
``model_config.proto``) written in text format. This module parses and writes it with
protobuf's :mod:`google.protobuf.text_format` against that very message, as generated in
``tritonclient.grpc.model_config_pb2`` (shipped with ``tritonclient[grpc]``, a dependency of
the project and of MLServer, so the V2 server's environment has it too). That one generated
module is loaded without the ``tritonclient.grpc`` package's ``__init__``, which imports
Triton's gRPC service protos: inside MLServer those collide with MLServer's own copy of the
KServe-V2 protos (both define ``inference.ServerLiveRequest`` in the default descriptor
pool), and ``ModelConfig`` needs neither. Whatever Triton would
refuse is refused here, with a :class:`~podium.errors.ConfigError` naming the file, the
line and the problem: an unknown or misspelled field (``unknown field 'dim' in
inference.ModelInput``), an unknown enum value (``TYPE_FOO``), a scalar given twice, bad
syntax. Nothing is kept as loose text or dicts: :attr:`ModelConfig.message` is the full
protobuf, and :class:`ModelConfig` is a typed view of the fields that matter for serving
(name, platform, tensors, version policy, file name).

Writers build a ``ModelConfig`` message and call :func:`render_model_config`, so a written
file is exactly what Triton reads back (round trip: ``parse(render(m)) == m``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import text_format

from podium.errors import ConfigError
from podium.policy.versions import is_version_number

CONFIG_FILE = "config.pbtxt"
"""File name of a model's configuration inside the repository."""

_MODULE = "tritonclient.grpc.model_config_pb2"


def _load_model_config_pb2() -> ModuleType:
    """Triton's generated ``model_config_pb2``, under its own name, without running the
    ``tritonclient.grpc`` package's ``__init__`` (see the module docstring). Registered in
    ``sys.modules``, so a later ``import tritonclient.grpc`` reuses this very module."""
    loaded = sys.modules.get(_MODULE)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("tritonclient")
    if package is None or not package.submodule_search_locations:
        raise ConfigError("tritonclient is not installed: it holds Triton's ModelConfig message")
    path = Path(next(iter(package.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(_MODULE, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ConfigError(f"tritonclient has no {path}: it holds Triton's ModelConfig message")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module
    spec.loader.exec_module(module)
    return module


model_config_pb2 = _load_model_config_pb2()
"""Triton's ``model_config_pb2`` (``tritonclient.grpc.model_config_pb2``)."""

TritonModelConfig = model_config_pb2.ModelConfig
"""Triton's ``inference.ModelConfig`` message class (``tritonclient.grpc.model_config_pb2``)."""

TRITON_DTYPES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
}
"""Triton ``DataType`` names -> KServe-V2 protocol data types (the ones Podium serves)."""

_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_POSITION = re.compile(r"^(\d+):(\d+) : ")


@dataclass(frozen=True, slots=True)
class TensorConfig:
    """One input or output of a model configuration."""

    name: str
    """Tensor name (the ONNX graph's input/output name)."""
    data_type: str
    """KServe-V2 data type, e.g. ``FP32`` or ``BOOL``."""
    dims: tuple[int, ...]
    """Shape without the batch dimension (when ``max_batch_size > 0``); -1 is variable."""
    reshape: tuple[int, ...] | None = None
    """Shape the model itself uses when it differs from ``dims`` (Triton's ``reshape``)."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The serving-relevant view of a Triton ``config.pbtxt``, with the full message beside it."""

    name: str
    """Model name; must equal its directory name in the repository."""
    platform: str
    """Triton platform (or backend when no platform is set), e.g. ``onnxruntime_onnx``."""
    max_batch_size: int
    """Largest batch per request; 0 means the model has no implicit batch dimension."""
    inputs: tuple[TensorConfig, ...]
    """Declared inputs."""
    outputs: tuple[TensorConfig, ...]
    """Declared outputs."""
    latest_versions: int | None = 1
    """Triton's version policy: serve the newest N versions (None with ``all``/``specific``)."""
    specific_versions: tuple[int, ...] = ()
    """Versions named by a ``specific`` policy."""
    default_model_filename: str = "model.onnx"
    """File inside each version directory."""
    message: Any = field(default=None, compare=False)
    """The parsed ``inference.ModelConfig`` message, every field included (e.g. the GPU
    ``optimization`` a V2 CPU server ignores). Typed ``Any``: tritonclient ships no stubs."""

    def versions_to_serve(self, available: list[int]) -> list[int]:
        """The versions of ``available`` the version policy selects, newest first."""
        ordered = sorted(set(available), reverse=True)
        if self.specific_versions:
            return [v for v in ordered if v in self.specific_versions]
        if self.latest_versions is None:
            return ordered
        return ordered[: self.latest_versions]


def _parse_error(source: str, exc: text_format.ParseError) -> ConfigError:
    """A ConfigError ``<source>:<line>:<col>: <problem>``; an unknown field is named as such."""
    text = str(exc)
    where = source
    pos = _POSITION.match(text)
    if pos is not None:
        where = f"{source}:{pos.group(1)}:{pos.group(2)}"
        text = text[pos.end() :]
    unknown = _UNKNOWN_FIELD.search(text)
    if unknown is not None:
        message, name = unknown.groups()
        text = (
            f"unknown field {name!r} in {message} (Triton's model configuration has no such field)"
        )
    return ConfigError(f"{where}: {text}")


def parse_model_config(text: str, source: str = CONFIG_FILE) -> Any:
    """``config.pbtxt`` text -> Triton's ``ModelConfig`` message (strict: no unknown fields).

    ``source`` (the file's path) is named in every error.
    """
    message = TritonModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise _parse_error(source, exc) from None
    return message


def render_model_config(message: Any, comments: Sequence[str] = ()) -> str:
    """Triton's ``ModelConfig`` message -> ``config.pbtxt`` text, after ``# comment`` lines.

    The text format has no place for comments inside a message, so the reasons behind
    settings go in a header.
    """
    if not isinstance(message, TritonModelConfig):
        raise TypeError(f"expected inference.ModelConfig, got {type(message).__name__}")
    header = "".join(f"# {line}".rstrip() + "\n" for line in comments)
    return header + text_format.MessageToString(message)


def _tensor(entry: Any, where: str) -> TensorConfig:
    if not entry.name:
        raise ConfigError(f"{where}: every input/output needs a name")
    dtype = model_config_pb2.DataType.Name(entry.data_type)
    if dtype not in TRITON_DTYPES:
        raise ConfigError(
            f"{where}: tensor {entry.name!r} has unsupported data_type {dtype} "
            f"(expected one of {', '.join(TRITON_DTYPES)})"
        )
    reshape = tuple(int(d) for d in entry.reshape.shape) if entry.HasField("reshape") else None
    return TensorConfig(
        entry.name, TRITON_DTYPES[dtype], tuple(int(d) for d in entry.dims), reshape
    )


def _version_policy(message: Any) -> tuple[int | None, tuple[int, ...]]:
    """(latest N or None, specific versions) of Triton's version policy; default: latest 1."""
    policy = message.version_policy
    chosen = policy.WhichOneof("policy_choice") if message.HasField("version_policy") else None
    if chosen == "latest":
        return int(policy.latest.num_versions or 1), ()
    if chosen == "all":
        return None, ()
    if chosen == "specific":
        return None, tuple(int(v) for v in policy.specific.versions)
    return 1, ()


def model_config_from_message(message: Any, source: str = CONFIG_FILE) -> ModelConfig:
    """The serving view of a parsed ``ModelConfig``; :class:`ConfigError` names ``source``."""
    if not message.name:
        raise ConfigError(f"{source}: 'name' is required")
    latest, specific = _version_policy(message)
    return ModelConfig(
        name=message.name,
        platform=message.platform or message.backend,
        max_batch_size=int(message.max_batch_size),
        inputs=tuple(_tensor(e, source) for e in message.input),
        outputs=tuple(_tensor(e, source) for e in message.output),
        latest_versions=latest,
        specific_versions=specific,
        default_model_filename=message.default_model_filename or "model.onnx",
        message=message,
    )


def model_config_from_text(text: str, source: str = CONFIG_FILE) -> ModelConfig:
    """Parse ``config.pbtxt`` text; :class:`ConfigError` names ``source`` and the problem."""
    return model_config_from_message(parse_model_config(text, source), source)


def read_model_config(model_dir: str | Path) -> ModelConfig:
    """Read ``<model_dir>/config.pbtxt`` and check its name matches the directory."""
    path = Path(model_dir) / CONFIG_FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    config = model_config_from_text(text, str(path))
    if config.name != Path(model_dir).name:
        raise ConfigError(
            f"{path}: name {config.name!r} differs from its directory {Path(model_dir).name!r} "
            "(Triton requires them to match)"
        )
    return config


def version_dirs(model_dir: str | Path) -> list[int]:
    """Numeric version directories of a model, ascending (Triton ignores other names)."""
    root = Path(model_dir)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and is_version_number(p.name))
