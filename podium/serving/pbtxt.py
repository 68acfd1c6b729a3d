"""Triton ``config.pbtxt``: the subset Podium uses, parsed and rendered with the stdlib only.

Triton's model configuration is a ``ModelConfig`` protobuf in text format. Both sides of the
repository need it: the project writes it next to each exported model, and the MLServer
adapter (which runs in MLServer's own environment, without tritonclient's generated protobuf
classes) reads it to serve the same files. So this module carries a small, generic reader of
the protobuf text format (fields, nested messages, repeated values in ``[...]``, comments,
quoted strings) into nested dicts, and a typed :class:`ModelConfig` view of the fields that
matter for serving. Unknown fields are kept in the dict and ignored, as Triton ignores nothing
but a V2 CPU server has no use for (e.g. ``optimization`` for TensorRT).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.errors import ConfigError
from podium.policy.versions import is_version_number

CONFIG_FILE = "config.pbtxt"
"""File name of a model's configuration inside the repository."""

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<punct>[{}\[\]:,;<>])
  | (?P<word>[A-Za-z0-9_.+\-]+)
    """,
    re.VERBOSE,
)

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
"""Triton config data types -> KServe-V2 protocol data types."""


def _tokens(text: str, source: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            line = text.count("\n", 0, pos) + 1
            raise ConfigError(f"{source}:{line}: unexpected character {text[pos]!r}")
        if m.lastgroup != "ws":
            out.append(m.group())
        pos = m.end()
    return out


def _scalar(token: str) -> Any:
    if token[0] in "\"'":
        return bytes(token[1:-1], "utf-8").decode("unicode_escape")
    for kind in (int, float):
        try:
            return kind(token)
        except ValueError:
            pass
    if token in ("true", "True"):
        return True
    if token in ("false", "False"):
        return False
    return token  # enum identifier, e.g. TYPE_FP32 or KIND_GPU


class _Parser:
    def __init__(self, tokens: list[str], source: str) -> None:
        self.tokens = tokens
        self.i = 0
        self.source = source

    def error(self, message: str) -> ConfigError:
        near = " ".join(self.tokens[max(0, self.i - 3) : self.i + 3])
        return ConfigError(f"{self.source}: {message} (near: {near!r})")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end of file")
        self.i += 1
        return tok

    def message(self, closing: str | None) -> dict[str, Any]:
        """Fields until ``closing`` (or the end). Repeated fields collect into lists."""
        fields: dict[str, Any] = {}
        while True:
            tok = self.peek()
            if tok is None:
                if closing is not None:
                    raise self.error(f"missing {closing!r}")
                return fields
            if tok == closing:
                self.i += 1
                return fields
            if tok in (",", ";"):
                self.i += 1
                continue
            name = self.take()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise self.error(f"expected a field name, got {name!r}")
            if self.peek() == ":":
                self.i += 1
            value = self.value()
            if name in fields:
                prev = fields[name]
                merged = prev if isinstance(prev, list) else [prev]
                merged.extend(value if isinstance(value, list) else [value])
                fields[name] = merged
            else:
                fields[name] = value

    def value(self) -> Any:
        tok = self.take()
        if tok in ("{", "<"):
            return self.message("}" if tok == "{" else ">")
        if tok == "[":
            items: list[Any] = []
            while self.peek() != "]":
                if self.peek() is None:
                    raise self.error("missing ']'")
                if self.peek() == ",":
                    self.i += 1
                    continue
                items.append(self.value())
            self.i += 1
            return items
        if tok in "{}[]:,;<>":
            raise self.error(f"unexpected {tok!r}")
        return _scalar(tok)


def parse_text(text: str, source: str = CONFIG_FILE) -> dict[str, Any]:
    """Protobuf text format -> nested dicts (repeated fields as lists). ``source`` names errors."""
    return _Parser(_tokens(text, source), source).message(None)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


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
    """The serving-relevant part of a Triton ``config.pbtxt``."""

    name: str
    """Model name; must equal its directory name in the repository."""
    platform: str
    """Triton platform, e.g. ``onnxruntime_onnx``."""
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
    raw: dict[str, Any] = field(default_factory=dict)
    """Every parsed field, including those not modelled here."""

    def versions_to_serve(self, available: list[int]) -> list[int]:
        """The versions of ``available`` the version policy selects, newest first."""
        ordered = sorted(set(available), reverse=True)
        if self.specific_versions:
            return [v for v in ordered if v in self.specific_versions]
        if self.latest_versions is None:
            return ordered
        return ordered[: self.latest_versions]


def _tensor(entry: Any, where: str) -> TensorConfig:
    if not isinstance(entry, dict) or "name" not in entry:
        raise ConfigError(f"{where}: every input/output needs a name")
    dtype = str(entry.get("data_type", ""))
    if dtype not in TRITON_DTYPES:
        raise ConfigError(
            f"{where}: tensor {entry['name']!r} has unsupported data_type {dtype!r} "
            f"(expected one of {', '.join(TRITON_DTYPES)})"
        )
    dims = tuple(int(d) for d in _as_list(entry.get("dims")))
    reshape_msg = entry.get("reshape")
    reshape = (
        tuple(int(d) for d in _as_list(reshape_msg.get("shape")))
        if isinstance(reshape_msg, dict)
        else None
    )
    return TensorConfig(str(entry["name"]), TRITON_DTYPES[dtype], dims, reshape)


def model_config_from_text(text: str, source: str = CONFIG_FILE) -> ModelConfig:
    """Parse ``config.pbtxt`` text; :class:`ConfigError` names ``source`` and the problem."""
    raw = parse_text(text, source)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{source}: 'name' is required")
    platform = str(raw.get("platform") or raw.get("backend") or "")
    policy = raw.get("version_policy") or {}
    latest: int | None = 1
    specific: tuple[int, ...] = ()
    if isinstance(policy, dict) and policy:
        if "latest" in policy:
            latest = int((policy["latest"] or {}).get("num_versions", 1))
        elif "all" in policy:
            latest = None
        elif "specific" in policy:
            latest = None
            specific = tuple(int(v) for v in _as_list(policy["specific"].get("versions")))
    return ModelConfig(
        name=name,
        platform=platform,
        max_batch_size=int(raw.get("max_batch_size", 0)),
        inputs=tuple(_tensor(e, source) for e in _as_list(raw.get("input"))),
        outputs=tuple(_tensor(e, source) for e in _as_list(raw.get("output"))),
        latest_versions=latest,
        specific_versions=specific,
        default_model_filename=str(raw.get("default_model_filename") or "model.onnx"),
        raw=raw,
    )


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
