"""A policy holder that hot-swaps versions without dropping a decision in flight.

The serving policy is an immutable :class:`Served` snapshot behind a single reference. A
decision takes the snapshot once and uses it to the end; a swap builds the *new* policy object
completely (read, sha256-verify, parse, construct) outside any lock and then replaces the
reference in one assignment under a lock. The old object is never mutated, so a decision that
started on version N finishes on version N, and the next one sees N+1. A version that fails to
load (missing, corrupt, tampered, wrong shape) raises :class:`~podium.errors.ArtifactError`
and leaves the previous version serving.

Announcements (:meth:`PolicyHolder.on_policy_updated`) are admitted only when
:mod:`podium.policy.signing` says so: hashed, signed by a trusted key over model, version and
hashes, and newer than the serving version. Weights are always checked against a hash the
caller trusts (the signed announcement's), never against a ``.sha256`` sidecar, which is
rewritten as easily as the file beside it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from podium.errors import ArtifactError, ProcessingError
from podium.policy.artifacts import LoadedWeights, load_into, load_weights, path_from_uri
from podium.policy.signing import TrustedKeys, verify_announcement

if TYPE_CHECKING:
    from podium.rl.networks import ActorCritic
    from podium.v1.reward_pb2 import PolicyUpdated

P = TypeVar("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Served(Generic[P]):
    """One loaded version: what a decision runs on."""

    version: int
    """Policy version."""
    policy: P
    """The policy object (never mutated after it is published here)."""
    sha256: str
    """Hash of the weights it was built from."""
    source: str
    """Where the weights came from (path)."""


class PolicyHolder(Generic[P]):
    """Holds the serving policy; ``build`` turns verified weights into a policy object.

    Thread-safe and usable from asyncio (:meth:`aload` runs the file work in a thread so the
    event loop keeps deciding while a new version loads). ``trusted``: the keys announcements
    must be signed by; without them every announcement is refused (:meth:`load` with a hash the
    caller already trusts still works, e.g. a run's own files).
    """

    def __init__(
        self, build: Callable[[LoadedWeights], P], trusted: TrustedKeys | None = None
    ) -> None:
        self._build = build
        self.trusted = trusted
        """Keys whose signed announcements are admitted (None: none are)."""
        self._served: Served[P] | None = None
        self._swap_lock = threading.Lock()
        self.last_error: ArtifactError | None = None
        """The most recent rejected version's error (None after a successful load)."""

    def current(self) -> Served[P]:
        """The serving snapshot. Use it for a whole decision."""
        served = self._served
        if served is None:
            raise ProcessingError("no policy version loaded yet")
        return served

    @property
    def version(self) -> int | None:
        """Serving version, None before the first load."""
        served = self._served
        return None if served is None else served.version

    def decide(self, fn: Callable[[P], T]) -> tuple[int, T]:
        """Run ``fn`` on one snapshot and return ``(version it ran on, result)``."""
        served = self.current()
        return served.version, fn(served.policy)

    def load(self, uri: str | Path, version: int, sha256: str) -> Served[P]:
        """Verify the file against ``sha256``, build version ``version`` and swap to it if
        newer than the serving one.

        Returns the snapshot now serving (the old one when ``version`` is not newer: a late,
        duplicated ``PolicyUpdated`` must not roll the policy back). On any failure raises
        :class:`ArtifactError`; the previous version keeps serving. An empty ``sha256`` is
        refused: falling back to the sidecar would trust whoever rewrote the file.
        """
        built = self.build(uri, version, sha256)
        return self.current() if built is None else self.publish(built)

    def build(self, uri: str | Path, version: int, sha256: str) -> Served[P] | None:
        """:meth:`load` without the swap: the verified, built snapshot, or None when
        ``version`` is not newer than the serving one (nothing is read then)."""
        served = self._served
        if served is not None and version <= served.version:
            return None
        path = path_from_uri(str(uri))
        try:
            if not sha256:
                raise ArtifactError(
                    f"{path}: version {version} has no expected sha256; refusing to trust its "
                    "sidecar file"
                )
            weights = load_weights(path, sha256)
            policy = self._build(weights)
        except ArtifactError as exc:
            self.last_error = exc
            raise
        except Exception as exc:
            err = ArtifactError(f"{path}: version {version} could not be built: {exc}")
            self.last_error = err
            raise err from exc
        return Served(version, policy, weights.sha256, str(path))

    def publish(self, new: Served[P]) -> Served[P]:
        """Serve an already built snapshot if it is newer than the serving one; return the
        snapshot now serving.

        For callers that must do more than :meth:`load` between building a version and
        serving it (the orchestrator's served backend first has the server load the version's
        ONNX export); the same no-rollback rule applies.
        """
        with self._swap_lock:
            # Re-check under the lock: two concurrent loads must not let an older one win.
            current = self._served
            if current is not None and new.version <= current.version:
                return current
            self._served = new
        self.last_error = None
        return new

    def admit(self, event: PolicyUpdated) -> None:
        """Raise :class:`~podium.policy.signing.RefusedAnnouncement` (kept in
        :attr:`last_error`) unless ``event`` may be served: hashed, signed by a trusted key,
        newer than the serving version (:func:`~podium.policy.signing.verify_announcement`)."""
        try:
            verify_announcement(event, self.trusted, self.version)
        except ArtifactError as exc:
            self.last_error = exc
            raise

    async def on_policy_updated(self, event: PolicyUpdated) -> bool:
        """Apply a ``PolicyUpdated`` event: True if it now serves, False if it was refused.

        A refused version is not an exception here: a consumer loop must keep going (and
        keep serving the previous version); the reason is in :attr:`last_error` (a
        :class:`~podium.policy.signing.RefusedAnnouncement` for a broken rule of
        :meth:`admit`, an :class:`ArtifactError` for a file that does not verify or build).
        """
        try:
            self.admit(event)
            served = await self.aload(event.uri, int(event.version), event.sha256)
        except ArtifactError:
            return False
        return served.version == int(event.version)

    async def aload(self, uri: str | Path, version: int, sha256: str) -> Served[P]:
        """:meth:`load` with the file work in a worker thread, so decisions on the event loop
        keep running, and the swap on the caller's thread: what the caller does right after
        (the orchestrator logs the version loaded) happens before any decision runs on it."""
        built = await asyncio.to_thread(self.build, uri, version, sha256)
        return self.current() if built is None else self.publish(built)


def build_actor_critic(weights: LoadedWeights) -> ActorCritic:
    """Build a :class:`podium.rl.networks.ActorCritic` in eval mode from verified weights.

    Imported lazily so the holder itself does not pull in torch-heavy modules.
    """
    from podium.rl.networks import ActorCritic

    model = ActorCritic.from_architecture(weights.metadata)
    load_into(model, weights)
    model.eval()
    return model
