"""Policy signing keys for tests: a real Ed25519 pair in a temporary directory, and the
signing of hand-built announcements (what a learner, or an attacker, would publish)."""

from __future__ import annotations

from pathlib import Path

from podium.policy.signing import KeyPair, SigningKey, TrustedKeys, generate_key_pair
from podium.v1 import reward_pb2


def key_pair(directory: Path, name: str = "policy-signing") -> KeyPair:
    """A fresh pair under ``directory``."""
    return generate_key_pair(directory, name)


def trusted(*pairs: KeyPair) -> TrustedKeys:
    """Trust the public halves of ``pairs`` (loaded from their files, as a service does)."""
    return TrustedKeys.load(",".join(str(p.public_path) for p in pairs))


def signed(event: reward_pb2.PolicyUpdated, pair: KeyPair) -> reward_pb2.PolicyUpdated:
    """``event`` signed by ``pair``'s private key (in place; returned)."""
    return SigningKey.load(pair.private_path).sign(event)
