"""Versioned policy weights on disk: safetensors plus a sha256 file, never pickle.

Layout: ``<root>/<name>/<version>/weights.safetensors`` and beside it
``weights.safetensors.sha256`` in ``sha256sum`` format (``<hex>  weights.safetensors``), so
``sha256sum -c`` checks it by hand. Files are written to a temporary name and moved into place
with :func:`os.replace`, so a reader never sees half a file under the final name.

Loading reads the file's bytes once, hashes those bytes, and only then parses those same bytes
with ``safetensors.torch.load``: what was verified is exactly what is loaded, and safetensors
cannot execute code the way ``torch.load`` on a pickle can. Any failure (missing file, hash
mismatch, unparsable contents) is an :class:`~podium.errors.ArtifactError` naming the file and,
for a mismatch, the expected and actual hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from podium.errors import ArtifactError

if TYPE_CHECKING:
    from podium.v1.reward_pb2 import PolicyUpdated

WEIGHTS_FILE = "weights.safetensors"
"""File name of the weights inside a version directory."""
HASH_SUFFIX = ".sha256"
"""Suffix of the sidecar hash file."""
METADATA_KEY = "podium"
"""The safetensors header metadata key holding our metadata as one JSON object."""


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """Where a published version lives and what its bytes hash to."""

    name: str
    """Model name (directory under the root)."""
    version: int
    """Monotonic version number."""
    path: Path
    """Absolute path of the safetensors file."""
    sha256: str
    """Lower-case hex sha256 of the file's bytes."""

    @property
    def uri(self) -> str:
        """``file://`` URI of the weights (what a ``PolicyUpdated`` event carries)."""
        return self.path.as_uri()


@dataclass(frozen=True, slots=True)
class LoadedWeights:
    """Tensors of a verified file and the string metadata stored in its header."""

    tensors: dict[str, Tensor]
    """Name -> tensor, on CPU."""
    metadata: dict[str, str]
    """Header metadata (architecture, version...)."""
    sha256: str
    """Hash of the bytes the tensors were parsed from."""
    path: Path
    """File they came from."""


def sha256_bytes(data: bytes) -> str:
    """Lower-case hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    """Lower-case hex sha256 of a file's contents; :class:`ArtifactError` if unreadable."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
    return h.hexdigest()


def path_from_uri(uri: str) -> Path:
    """A local path from a ``file://`` URI or a plain path; other schemes are an error."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme == "file" else uri)
    raise ArtifactError(f"unsupported weights URI scheme {parsed.scheme!r} in {uri!r}")


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync, ``os.replace``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def publish_weights(
    tensors: Mapping[str, Tensor],
    root: str | Path,
    name: str,
    version: int,
    *,
    metadata: Mapping[str, str] | None = None,
) -> ArtifactRef:
    """Write ``tensors`` as version ``version`` of ``name`` and return its reference.

    A version is immutable: republishing identical bytes is a no-op, different bytes under an
    existing version raise :class:`ArtifactError`. The sidecar hash is written after the
    weights, so a sidecar always describes a complete file.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ArtifactError(f"invalid model name {name!r} (non-empty, no '/')")
    if version < 0:
        raise ArtifactError(f"invalid version {version} for {name} (must be >= 0)")
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    meta.setdefault("name", name)
    meta.setdefault("version", str(version))
    # safetensors refuses shared or strided storage; detached contiguous copies are safe to save.
    plain = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    # One metadata key holding sorted JSON: safetensors writes several keys in hash-map order,
    # which varies between calls, and equal weights must give equal bytes (and hashes).
    data = st_save(plain, metadata={METADATA_KEY: json.dumps(meta, sort_keys=True)})
    digest = sha256_bytes(data)
    directory = Path(root).resolve() / name / str(version)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / WEIGHTS_FILE
    if path.exists():
        existing = sha256_file(path)
        if existing != digest:
            raise ArtifactError(
                f"{path}: version {version} of {name} already exists with sha256 {existing}; "
                f"refusing to overwrite it with {digest} (versions are immutable)"
            )
    else:
        atomic_write(path, data)
    atomic_write(path.with_name(WEIGHTS_FILE + HASH_SUFFIX), f"{digest}  {WEIGHTS_FILE}\n".encode())
    return ArtifactRef(name=name, version=version, path=path, sha256=digest)


def read_sidecar_hash(path: Path) -> str:
    """The hash recorded in ``<path>.sha256``; :class:`ArtifactError` if missing or malformed."""
    sidecar = path.with_name(path.name + HASH_SUFFIX)
    try:
        text = sidecar.read_text().strip()
    except OSError as exc:
        raise ArtifactError(f"cannot read hash file {sidecar}: {exc.strerror or exc}") from None
    digest = text.split()[0].lower() if text else ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ArtifactError(f"hash file {sidecar} does not hold a sha256 hex digest")
    return digest


def _header_metadata(data: bytes, path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors header (8-byte little-endian length, then JSON)."""
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        raw = (header.get("__metadata__") or {}).get(METADATA_KEY, "{}")
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError(f"metadata {METADATA_KEY!r} is not a JSON object")
    except (struct.error, ValueError, AttributeError) as exc:
        raise ArtifactError(f"{path}: unreadable safetensors header ({exc})") from None
    return {str(k): str(v) for k, v in meta.items()}


def load_weights(path: str | Path, expected_sha256: str | None = None) -> LoadedWeights:
    """Read, verify and parse a weights file.

    ``expected_sha256`` is the hash the caller trusts (e.g. from a ``PolicyUpdated`` event);
    when None, the sidecar ``.sha256`` file is used. Raises :class:`ArtifactError` naming the
    file and both hashes on a mismatch.
    """
    p = Path(path)
    expected = (expected_sha256 or read_sidecar_hash(p)).strip().lower()
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read weights {p}: {exc.strerror or exc}") from None
    actual = sha256_bytes(data)
    if actual != expected:
        raise ArtifactError(
            f"{p}: sha256 mismatch, expected {expected}, actual {actual} "
            "(file corrupt or tampered with; refusing to load it)"
        )
    try:
        tensors = st_load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError for bad contents
        raise ArtifactError(
            f"{p}: hash matches but contents are not valid safetensors: {exc}"
        ) from None
    return LoadedWeights(tensors=tensors, metadata=_header_metadata(data, p), sha256=actual, path=p)


def policy_updated_event(
    ref: ArtifactRef, metrics: Mapping[str, float] | None = None
) -> PolicyUpdated:
    """The ``PolicyUpdated`` event announcing ``ref`` (publish it after the files are in place)."""
    from podium.v1.reward_pb2 import PolicyUpdated

    event = PolicyUpdated(model_name=ref.name, version=ref.version, uri=ref.uri, sha256=ref.sha256)
    for key, value in (metrics or {}).items():
        event.metrics[key] = float(value)
    return event


def load_into(module: torch.nn.Module, weights: LoadedWeights) -> None:
    """Copy verified weights into ``module`` (strict: names and shapes must match exactly)."""
    try:
        module.load_state_dict(weights.tensors, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(f"{weights.path}: weights do not fit the model: {exc}") from None
