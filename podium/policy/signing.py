"""Signed policy announcements: the learner signs, orchestrators serve only what verifies.

A ``PolicyUpdated`` event says *which* bytes are version N of a model: the weights' sha256 and,
when there is an ONNX export, its sha256. A file's ``.sha256`` sidecar is written beside it and
rewritten with it, so it proves nothing; an unsigned event can be produced by anyone who can
write to the topic, with any hash and any version (a forged version 2^62 would lock every later
real version out). So the learner signs, with Ed25519, the canonical bytes of
``(model_name, version, sha256, onnx_sha256)`` (:func:`announcement_payload`), and a consumer
admits an announcement only when (:func:`verify_announcement`):

* it carries a weights hash (and an ONNX hash when it names an ONNX file) — *hashless*
  announcements are refused, never resolved through a sidecar;
* it is signed (``signature``, ``signing_key_id``) by a key in its :class:`TrustedKeys`, and the
  signature verifies over exactly those fields — a flipped hash or version breaks it;
* its version is greater than the one serving (:func:`check_sequence`): replayed old
  announcements cannot roll a policy back, and a forged high version cannot be signed.

Keys are files: the learner's private key (PKCS#8 PEM, ``PODIUM_POLICY_SIGNING_KEY``, mounted
from a Kubernetes Secret) and the orchestrators' trusted public keys (SubjectPublicKeyInfo PEM,
``PODIUM_POLICY_TRUSTED_KEYS``: comma-separated files or directories). A key id is derived from
the public key (:func:`key_id`), so rotating is: trust the new public key beside the old one,
switch the learner to the new private key, then drop the old public key.
``podium keys generate`` (and ``podium train``, for its own run) makes a pair with
:func:`generate_key_pair`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from podium.errors import ArtifactError, ConfigError

if TYPE_CHECKING:
    from podium.v1.reward_pb2 import PolicyUpdated

SIGNING_KEY_VAR = "PODIUM_POLICY_SIGNING_KEY"
"""Setting of the learner: path of its private signing key (PEM)."""
TRUSTED_KEYS_VAR = "PODIUM_POLICY_TRUSTED_KEYS"
"""Setting of a policy consumer: trusted public keys (comma-separated PEM files or directories)."""
DEFAULT_KEY_NAME = "policy-signing"
"""Base name of a generated pair: ``<name>.pem`` (private) and ``<name>.pub`` (public)."""
PAYLOAD_DOMAIN = b"podium.policy-announcement.v1\n"
"""Prefix of every signed payload, so a signature over these bytes means nothing elsewhere."""
HOW_TO_MAKE_KEYS = (
    "make a key pair with `podium keys generate --out DIR` and give the learner "
    f"{SIGNING_KEY_VAR}=DIR/{DEFAULT_KEY_NAME}.pem and every orchestrator "
    f"{TRUSTED_KEYS_VAR}=DIR/{DEFAULT_KEY_NAME}.pub (in Kubernetes: the Secrets "
    "podium-policy-signing-key and podium-policy-trusted-keys, k8s/components/operator-secrets)"
)
"""The remedy every missing-key error names."""

# Why an announcement was refused (RefusedAnnouncement.reason): stable words for logs and tests.
HASHLESS = "hashless"
UNSIGNED = "unsigned"
UNTRUSTED_KEY = "untrusted-key"
BAD_SIGNATURE = "bad-signature"
OUT_OF_SEQUENCE = "out-of-sequence"
NO_TRUSTED_KEYS = "no-trusted-keys"


class RefusedAnnouncement(ArtifactError):
    """A ``PolicyUpdated`` that must not be served; :attr:`reason` says which rule it broke.

    Never retriable: the same event would be refused again, so a consumer logs it, keeps the
    previous version serving, and consumes the event.
    """

    retriable = False

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        """One of the module's reason words (``unsigned``, ``bad-signature``, ...)."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """The id of a key: the first 16 hex digits of the sha256 of its 32 raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def announcement_payload(event: PolicyUpdated) -> bytes:
    """The bytes a signature covers: the domain, then sorted compact JSON of the model name,
    version, weights sha256 and ONNX sha256 (empty when there is no export). JSON with fixed
    keys keeps the fields unambiguous (no separator can be smuggled into a name)."""
    body = {
        "model_name": event.model_name,
        "version": int(event.version),
        "sha256": event.sha256,
        "onnx_sha256": event.onnx_sha256,
    }
    return PAYLOAD_DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


def _label(event: PolicyUpdated) -> str:
    return f"{event.model_name or '<no model>'} v{event.version}"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The learner's private key and its id."""

    key_id: str
    """Id of the key (:func:`key_id` of its public half), stamped on each announcement."""
    private_key: Ed25519PrivateKey
    """The Ed25519 private key."""

    @classmethod
    def load(cls, path: str | Path, setting: str = SIGNING_KEY_VAR) -> SigningKey:
        """Read a PKCS#8 PEM Ed25519 private key; :class:`ConfigError` naming ``setting``, the
        file and the remedy when it is missing, unreadable or not such a key."""
        if not str(path):
            raise ConfigError(
                f"{setting} is not set: announcements must be signed; {HOW_TO_MAKE_KEYS}"
            )
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except OSError as exc:
            raise ConfigError(
                f"{setting}={str(path)!r}: cannot read the signing key ({exc.strerror or exc}); "
                f"{HOW_TO_MAKE_KEYS}"
            ) from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"{setting}={str(path)!r}: not an unencrypted PEM private key ({exc}); "
                f"{HOW_TO_MAKE_KEYS}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(
                f"{setting}={str(path)!r}: a {type(key).__name__}, not an Ed25519 key; "
                f"{HOW_TO_MAKE_KEYS}"
            )
        return cls(key_id(key.public_key()), key)

    def sign(self, event: PolicyUpdated) -> PolicyUpdated:
        """Sign ``event`` in place (``signature``, ``signing_key_id``) and return it."""
        event.signature = self.private_key.sign(announcement_payload(event))
        event.signing_key_id = self.key_id
        return event


def _public_key_from_file(path: Path, setting: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError(
            f"{setting}: cannot read trusted key {path} ({exc.strerror or exc}); {HOW_TO_MAKE_KEYS}"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{setting}: {path} is not a PEM public key ({exc}); only public keys are trusted "
            f"(never put the private key here); {HOW_TO_MAKE_KEYS}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{setting}: {path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def _key_files(entry: Path, setting: str) -> list[Path]:
    """The files ``entry`` names: itself, or a directory's visible files (a Kubernetes Secret
    volume's ``..data`` bookkeeping entries start with a dot and are skipped)."""
    if entry.is_dir():
        return sorted(p for p in entry.iterdir() if not p.name.startswith(".") and p.is_file())
    if not entry.exists():
        raise ConfigError(f"{setting}: {entry} does not exist; {HOW_TO_MAKE_KEYS}")
    return [entry]


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """The public keys a consumer accepts announcements from, by key id."""

    keys: Mapping[str, Ed25519PublicKey]
    """Key id -> public key (several during a rotation)."""

    @classmethod
    def of(cls, *public_keys: Ed25519PublicKey) -> TrustedKeys:
        """Trust exactly ``public_keys``."""
        return cls({key_id(k): k for k in public_keys})

    @classmethod
    def load(cls, spec: str, setting: str = TRUSTED_KEYS_VAR) -> TrustedKeys:
        """Trust the PEM public keys ``spec`` names (comma-separated files or directories).

        Raises :class:`ConfigError` naming ``setting`` and the remedy when ``spec`` is empty,
        names nothing, or names a file that is not an Ed25519 public key.
        """
        entries = [Path(p.strip()) for p in spec.split(",") if p.strip()]
        if not entries:
            raise ConfigError(
                f"{setting} is not set: a learned policy is served only from announcements "
                f"signed by a trusted key; {HOW_TO_MAKE_KEYS}"
            )
        files = [f for entry in entries for f in _key_files(entry, setting)]
        if not files:
            raise ConfigError(f"{setting}={spec!r} holds no key files; {HOW_TO_MAKE_KEYS}")
        return cls.of(*(_public_key_from_file(f, setting) for f in files))

    def verify(self, event: PolicyUpdated) -> None:
        """Raise :class:`RefusedAnnouncement` unless ``event`` is hashed and signed by one of
        these keys over exactly its model name, version and hashes."""
        label = _label(event)
        if not _is_sha256(event.sha256):
            raise RefusedAnnouncement(
                HASHLESS,
                f"refused {label}: hashless announcement (sha256={event.sha256!r} is not a "
                "sha256 hex digest); weights are loaded only against the announced hash, never "
                "a sidecar file",
            )
        if (event.onnx_uri or event.onnx_sha256) and not _is_sha256(event.onnx_sha256):
            raise RefusedAnnouncement(
                HASHLESS,
                f"refused {label}: names an ONNX export without a valid onnx_sha256 "
                f"({event.onnx_sha256!r})",
            )
        if not event.signature or not event.signing_key_id:
            raise RefusedAnnouncement(
                UNSIGNED,
                f"refused {label}: unsigned announcement (no signature / signing_key_id); only "
                "versions signed by the learner's key are served",
            )
        public = self.keys.get(event.signing_key_id)
        if public is None:
            raise RefusedAnnouncement(
                UNTRUSTED_KEY,
                f"refused {label}: signed by key {event.signing_key_id!r}, which is not "
                f"trusted (trusted: {', '.join(sorted(self.keys)) or 'none'}; "
                f"{TRUSTED_KEYS_VAR})",
            )
        try:
            public.verify(event.signature, announcement_payload(event))
        except InvalidSignature:
            raise RefusedAnnouncement(
                BAD_SIGNATURE,
                f"refused {label}: the signature by key {event.signing_key_id} does not verify "
                "over its model name, version and hashes (altered or forged announcement)",
            ) from None


def check_sequence(event: PolicyUpdated, serving: int | None) -> None:
    """Raise :class:`RefusedAnnouncement` unless ``event``'s version is greater than the
    ``serving`` one (None: nothing serves yet, any version may start)."""
    if serving is not None and int(event.version) <= serving:
        raise RefusedAnnouncement(
            OUT_OF_SEQUENCE,
            f"refused {_label(event)}: out of sequence, not greater than the serving "
            f"version {serving}",
        )


def verify_announcement(
    event: PolicyUpdated, trusted: TrustedKeys | None, serving: int | None
) -> None:
    """All the rules of the module docstring, in order: hashes, signature, sequence (the
    signature first, so a forged event is reported as forged whatever its version)."""
    if trusted is None:
        raise RefusedAnnouncement(
            NO_TRUSTED_KEYS,
            f"refused {_label(event)}: no trusted keys are configured ({TRUSTED_KEYS_VAR}); "
            f"{HOW_TO_MAKE_KEYS}",
        )
    trusted.verify(event)
    check_sequence(event, serving)


def announcement_event_id(event: PolicyUpdated) -> str:
    """The event id to publish a signed announcement under:
    ``<model>:<version>:<first 16 hex digits of its signature>``.

    Consumers dedupe by event id. Under ``<model>:<version>`` alone, anyone who can write to the
    topic could publish junk under the id of the next versions first, and the genuine events
    would be dropped as duplicates. An Ed25519 signature cannot be predicted without the key and
    is deterministic with it, so a restarted learner's re-announcement (same fields, same
    signature) keeps its id and still dedupes. Unsigned: ``<model>:<version>``.
    """
    base = f"{event.model_name}:{event.version}"
    return f"{base}:{event.signature[:8].hex()}" if event.signature else base


@dataclass(frozen=True, slots=True)
class KeyPair:
    """Where a generated pair lies."""

    private_path: Path
    """The private key (PKCS#8 PEM, mode 0600): the learner's ``PODIUM_POLICY_SIGNING_KEY``."""
    public_path: Path
    """The public key (SubjectPublicKeyInfo PEM): orchestrators' ``PODIUM_POLICY_TRUSTED_KEYS``."""
    key_id: str
    """Its key id."""


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (never readable by others, even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def generate_key_pair(directory: str | Path, name: str = DEFAULT_KEY_NAME) -> KeyPair:
    """Make a new Ed25519 pair as ``<directory>/<name>.pem`` and ``<name>.pub``.

    Refuses (:class:`ConfigError`) to overwrite either file: replacing a deployed key by
    accident would make every orchestrator refuse the learner.
    """
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"invalid key name {name!r} (non-empty, no '/', no leading '.')")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    private_path, public_path = root / f"{name}.pem", root / f"{name}.pub"
    for p in (private_path, public_path):
        if p.exists():
            raise ConfigError(
                f"{p} already exists; refusing to overwrite a key (rotate with a new name)"
            )
    key = Ed25519PrivateKey.generate()
    _write_new(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    public = key.public_key()
    _write_new(
        public_path,
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    return KeyPair(private_path, public_path, key_id(public))


def ensure_key_pair(directory: str | Path, name: str = DEFAULT_KEY_NAME) -> KeyPair:
    """The pair ``<directory>/<name>.{pem,pub}``, generated when absent (a run that reuses its
    directory keeps signing with the key its earlier versions were signed with)."""
    root = Path(directory)
    private_path, public_path = root / f"{name}.pem", root / f"{name}.pub"
    if not private_path.exists() and not public_path.exists():
        return generate_key_pair(root, name)
    signing = SigningKey.load(private_path)
    trusted = TrustedKeys.load(str(public_path))
    if signing.key_id not in trusted.keys:
        raise ConfigError(f"{private_path} and {public_path} are not one key pair")
    return KeyPair(private_path, public_path, signing.key_id)


__all__ = [
    "BAD_SIGNATURE",
    "HASHLESS",
    "HOW_TO_MAKE_KEYS",
    "NO_TRUSTED_KEYS",
    "OUT_OF_SEQUENCE",
    "SIGNING_KEY_VAR",
    "TRUSTED_KEYS_VAR",
    "UNSIGNED",
    "UNTRUSTED_KEY",
    "KeyPair",
    "RefusedAnnouncement",
    "SigningKey",
    "TrustedKeys",
    "announcement_event_id",
    "announcement_payload",
    "check_sequence",
    "ensure_key_pair",
    "generate_key_pair",
    "key_id",
    "verify_announcement",
]
