"""Policy backends: the same decision function in-process (torch) or on a KServe-V2 server.

Both implement :class:`PolicyBackend`: ``decide(PolicyInputs) -> PolicyOutputs`` on a batch in
the serving layout of :mod:`podium.serving.contract`. The orchestrator picks one by config
(:func:`make_policy_backend`): ``local`` runs the torch module in the process (the embedded
default, no server needed); ``v2://HOST:PORT`` calls a KServe-V2 gRPC server through
``tritonclient``: Triton with TensorRT on GPUs in production, MLServer with the onnxruntime
adapter (``scripts/v2server.sh``) on CPU machines. The client code is the same for both.

New versions go live through the V2 repository API: the learner exports
``<repository>/<model>/<version>/model.onnx`` and publishes ``PolicyUpdated``; the served
backend's :meth:`ServedPolicy.on_policy_updated` asks the server to (re)load the model, which
then serves the newest version, and checks that the version the server reports is the one the
event announced. Requests keep flowing during the swap: both servers load the new version
before they retire the old one.

tritonclient / MLServer differences handled here, at the protocol level:

- ``ModelReady`` for a model that is not loaded: Triton answers ``ready=false``; MLServer
  answers with an error ("Model ... not found"). :meth:`ServedPolicy.model_ready` maps both to
  ``False``.
- ``value`` comes back as ``[batch, 1]`` from Triton (the ``reshape`` in ``config.pbtxt``)
  and ``[batch]`` from MLServer; :meth:`ServedPolicy.decide` flattens it to ``[batch]``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import nn

from podium.config import env
from podium.errors import ArtifactError, ConfigError, PodiumError, ProcessingError
from podium.policy.versions import is_version_number
from podium.serving.contract import (
    INPUT_NAMES,
    OUTPUT_NAMES,
    PolicyInputs,
    PolicyOutputs,
    PolicySignature,
)
from podium.serving.endpoint import LOCAL, V2_SCHEME, parse_backend

if TYPE_CHECKING:
    from podium.v1.reward_pb2 import PolicyUpdated


class PolicyBackend(Protocol):
    """What the orchestrator needs from a policy, wherever it runs."""

    def decide(self, inputs: PolicyInputs) -> PolicyOutputs:
        """Masked logits and values for a batch of observations."""
        ...

    def close(self) -> None:
        """Release connections or memory; the backend is unusable afterwards."""
        ...


class LocalPolicy:
    """The policy module run in-process with torch (the embedded default).

    A swap replaces the module reference in one assignment, so a decision uses one version
    from start to end, as with the served backend.
    """

    def __init__(
        self,
        module: nn.Module,
        signature: PolicySignature,
        *,
        version: str = LOCAL,
        validate: bool = True,
    ) -> None:
        self.signature = signature
        self.validate = validate
        """Check every batch against the signature (cheap; off only in benchmarks of raw speed)."""
        self._current: tuple[nn.Module, str] = (module.eval(), version)

    @property
    def version(self) -> str:
        """Version label of the module in use."""
        return self._current[1]

    def swap(self, module: nn.Module, version: str) -> None:
        """Serve ``module`` from the next decision on."""
        self._current = (module.eval(), version)

    def decide(self, inputs: PolicyInputs) -> PolicyOutputs:
        """Run the module on ``inputs`` under ``torch.inference_mode``."""
        if self.validate:
            inputs.validate(self.signature)
        module, version = self._current
        with torch.inference_mode():
            logits, value = module(*(torch.from_numpy(a) for a in inputs.arrays().values()))
        return PolicyOutputs(
            logits=logits.numpy(), value=value.reshape(inputs.batch).numpy(), version=version
        )

    def close(self) -> None:
        """Nothing to release."""


def verify_onnx_export(event: PolicyUpdated) -> Path:
    """Check the ONNX file a ``PolicyUpdated`` event announces; return its path.

    The server checks each version against its ``model.onnx.sha256`` sidecar, but the sidecar
    is written beside the file and would be rewritten with it; the event's ``onnx_sha256`` is
    the learner's own statement of what it exported, so the orchestrator compares the file
    with it before asking the server to load anything. The file must be readable here (the
    orchestrator mounts the model repository at the path the learner wrote, read-only) and sit
    in ``<repository>/<model_name>/<version>/``, the directory the server will load the
    version from. Any mismatch is an :class:`ArtifactError` naming the file.
    """
    from podium.policy.artifacts import path_from_uri, sha256_file

    if not event.onnx_uri:
        raise ArtifactError(
            f"{event.model_name} v{event.version}: PolicyUpdated has onnx_sha256 but no onnx_uri"
        )
    path = path_from_uri(event.onnx_uri)
    if path.parent.name != str(event.version) or path.parent.parent.name != event.model_name:
        raise ArtifactError(
            f"{path}: announced as {event.model_name} version {event.version}, but a server "
            f"loads that version from <repository>/{event.model_name}/{event.version}/"
        )
    if not path.is_file():
        raise ArtifactError(
            f"{path}: announced ONNX export of {event.model_name} v{event.version} is not "
            "readable here; mount the model repository where the learner writes it"
        )
    actual = sha256_file(path)
    if actual != event.onnx_sha256.lower():
        raise ArtifactError(
            f"{path}: sha256 mismatch, announced {event.onnx_sha256}, file has {actual} "
            "(corrupt or tampered with; not loading it)"
        )
    return path


def _grpc_error(exc: Exception) -> tuple[str, str]:
    """(status, message) of a tritonclient InferenceServerException.

    tritonclient reports gRPC codes as ``"StatusCode.UNAVAILABLE"``; the prefix is dropped so
    the code compares with :data:`_RETRIABLE`.
    """
    status = getattr(exc, "status", lambda: None)()
    message = getattr(exc, "message", lambda: str(exc))()
    return str(status or "").removeprefix("StatusCode."), str(message or exc)


_RETRIABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")


class ServedPolicy:
    """The policy on a KServe-V2 server, called with ``tritonclient.grpc``.

    Thread-safe: one gRPC channel is shared by every caller (the orchestrator's sessions).
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        signature: PolicySignature,
        *,
        timeout_s: float = 5.0,
        validate: bool = True,
    ) -> None:
        import tritonclient.grpc as grpcclient  # heavy: imported only when serving is used

        self._grpc = grpcclient
        self.url = url
        self.model_name = model_name
        self.signature = signature
        self.timeout_s = timeout_s
        self.validate = validate
        self._client = grpcclient.InferenceServerClient(url=url)
        self._outputs = [grpcclient.InferRequestedOutput(name) for name in OUTPUT_NAMES]
        self._load_lock = threading.Lock()

    # -- health -------------------------------------------------------------------------------

    def server_ready(self) -> bool:
        """The server answers and reports ready (False when unreachable)."""
        try:
            return bool(self._client.is_server_ready(client_timeout=self.timeout_s))
        except Exception:
            return False

    def model_ready(self) -> bool:
        """The model is loaded and ready (False when not loaded, on Triton and MLServer alike)."""
        try:
            return bool(self._client.is_model_ready(self.model_name, client_timeout=self.timeout_s))
        except Exception:
            return False

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until server and model are ready; :class:`ProcessingError` (retriable) if not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server_ready() and self.model_ready():
                return
            time.sleep(0.1)
        raise ProcessingError(
            f"model {self.model_name} on {self.url} not ready after {timeout_s} s", retriable=True
        )

    def served_versions(self) -> list[str]:
        """Versions the server reports serving for the model (its metadata)."""
        try:
            meta = self._client.get_model_metadata(self.model_name, client_timeout=self.timeout_s)
        except Exception as exc:
            status, message = _grpc_error(exc)
            raise ProcessingError(
                f"{self.url}: metadata of {self.model_name} failed: {status} {message}",
                retriable=status in _RETRIABLE,
            ) from None
        return [str(v) for v in meta.versions]

    # -- repository API ----------------------------------------------------------------------

    def load(self, version: int | None = None) -> str:
        """Ask the server to (re)load the model; return the version it now serves.

        The server picks the newest version its policy allows. ``version``, when given, is what
        the caller expects to go live (e.g. from ``PolicyUpdated``): a server that ends up on
        another version is an :class:`ArtifactError`. A version that fails to load (missing,
        corrupt, wrong signature) raises :class:`ArtifactError` with the server's message,
        which names the file; the previously loaded version keeps serving.
        """
        with self._load_lock:
            try:
                self._client.load_model(self.model_name, client_timeout=max(self.timeout_s, 60.0))
            except Exception as exc:
                status, message = _grpc_error(exc)
                raise ArtifactError(
                    f"{self.url}: loading {self.model_name}"
                    + (f" version {version}" if version is not None else "")
                    + f" failed ({status}): {message}",
                    retriable=status in _RETRIABLE,
                ) from None
            versions = self.served_versions()
        if version is not None and str(version) not in versions:
            raise ArtifactError(
                f"{self.url}: asked to load {self.model_name} version {version}, but the server "
                f"serves {versions or 'nothing'} (is {version} the newest version directory?)"
            )
        return (
            max(versions, key=lambda v: int(v) if is_version_number(v) else -1) if versions else ""
        )

    def unload(self) -> None:
        """Ask the server to unload the model (all versions)."""
        try:
            self._client.unload_model(self.model_name, client_timeout=max(self.timeout_s, 60.0))
        except Exception as exc:
            status, message = _grpc_error(exc)
            raise ProcessingError(
                f"{self.url}: unloading {self.model_name} failed ({status}): {message}",
                retriable=status in _RETRIABLE,
            ) from None

    def on_policy_updated(self, event: PolicyUpdated) -> str:
        """Make the version announced by a ``PolicyUpdated`` event go live; return it.

        Events for other models are ignored (returns the empty string): one topic carries every
        model's updates. An event that carries ``onnx_sha256`` is checked first
        (:func:`verify_onnx_export`): a file that does not hash to what the learner announced
        is never offered to the server, and the version serving now keeps serving.
        """
        if event.model_name != self.model_name:
            return ""
        if event.onnx_sha256:
            verify_onnx_export(event)
        return self.load(int(event.version))

    # -- inference ---------------------------------------------------------------------------

    def decide(self, inputs: PolicyInputs) -> PolicyOutputs:
        """One ``ModelInfer`` call for the whole batch; :class:`ProcessingError` on failure."""
        if self.validate:
            inputs.validate(self.signature)
        g = self._grpc
        tensors = []
        for name, array in inputs.arrays().items():
            t = g.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "FP32")
            t.set_data_from_numpy(array)
            tensors.append(t)
        try:
            result = self._client.infer(
                self.model_name, tensors, outputs=self._outputs, client_timeout=self.timeout_s
            )
        except Exception as exc:
            status, message = _grpc_error(exc)
            raise ProcessingError(
                f"{self.url}: inference on {self.model_name} failed ({status}): {message}",
                retriable=status in _RETRIABLE,
            ) from None
        logits = result.as_numpy("logits")
        value = result.as_numpy("value")
        if logits is None or value is None:
            raise ProcessingError(f"{self.url}: response of {self.model_name} lacks an output")
        return PolicyOutputs(
            logits=np.asarray(logits, dtype=np.float32),
            value=np.asarray(value, dtype=np.float32).reshape(inputs.batch),
            version=str(result.get_response().model_version),
        )

    def close(self) -> None:
        """Close the gRPC channel."""
        self._client.close()


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """Which policy backend the orchestrator uses, read from the environment."""

    policy_backend: str = env("PODIUM_POLICY_BACKEND", default=LOCAL)
    """``local`` (in-process torch) or ``v2://HOST:PORT`` (KServe-V2 gRPC server)."""
    model_name: str = env("PODIUM_MODEL_NAME", default="swarm_policy")
    """Model name in the repository and on the server."""
    model_repository: str = env("PODIUM_MODEL_REPOSITORY", default="triton_models")
    """Triton model repository the learner exports into and the server reads."""
    timeout_s: float = env("PODIUM_SERVING_TIMEOUT_S", default=5.0)
    """Deadline of one inference call, in seconds."""
    ready_timeout_s: float = env("PODIUM_SERVING_READY_TIMEOUT_S", default=30.0)
    """How long start-up waits for the server and model to be ready."""

    def __post_init__(self) -> None:
        parse_backend(self.policy_backend)
        if self.timeout_s <= 0 or self.ready_timeout_s <= 0:
            raise ConfigError("PODIUM_SERVING_TIMEOUT_S and ..._READY_TIMEOUT_S must be > 0")


def make_policy_backend(
    config: ServingConfig,
    signature: PolicySignature,
    module: nn.Module | None = None,
    *,
    load: bool = True,
) -> LocalPolicy | ServedPolicy:
    """The backend ``config`` selects.

    ``local`` needs ``module``. A served backend asks the server to load the model when
    ``load`` is true (the repository API; a no-op reload if it is already loaded) and waits
    until it is ready, so the first decision does not fail.
    """
    address = parse_backend(config.policy_backend)
    if address is None:
        if module is None:
            raise ConfigError("PODIUM_POLICY_BACKEND=local needs a policy module to run")
        return LocalPolicy(module, signature)
    served = ServedPolicy(address, config.model_name, signature, timeout_s=config.timeout_s)
    try:
        if load:
            served.load()
        served.wait_ready(config.ready_timeout_s)
    except PodiumError:
        served.close()
        raise
    return served


__all__ = [
    "INPUT_NAMES",
    "LOCAL",
    "V2_SCHEME",
    "LocalPolicy",
    "PolicyBackend",
    "ServedPolicy",
    "ServingConfig",
    "make_policy_backend",
    "parse_backend",
    "verify_onnx_export",
]
