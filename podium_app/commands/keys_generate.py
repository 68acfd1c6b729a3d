"""``podium keys generate``: a new Ed25519 key pair for signing policy announcements.

The learner signs every ``PolicyUpdated`` with the private key (``PODIUM_POLICY_SIGNING_KEY``);
orchestrators serve only versions signed by a key in ``PODIUM_POLICY_TRUSTED_KEYS``
(:mod:`podium.policy.signing`). The command writes ``<out>/<name>.pem`` (private, mode 0600)
and ``<out>/<name>.pub`` (public), never overwriting a key, and prints the key id and the
settings (or the ``kubectl`` line that puts each half in its Secret). Exit 0, or 2 with the
reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from podium.errors import PodiumError
from podium.policy.signing import (
    DEFAULT_KEY_NAME,
    SIGNING_KEY_VAR,
    TRUSTED_KEYS_VAR,
    generate_key_pair,
)

PROG = "podium keys generate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``podium keys generate``."""
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write into")
    parser.add_argument(
        "--name",
        default=DEFAULT_KEY_NAME,
        help=f"base name of the files (default {DEFAULT_KEY_NAME}; a new name to rotate)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the pair; print where it is and how to use it."""
    try:
        pair = generate_key_pair(Path(args.out), args.name)
    except (PodiumError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print(f"key id {pair.key_id}")
    print(f"learner:       {SIGNING_KEY_VAR}={pair.private_path}")
    print(f"orchestrators: {TRUSTED_KEYS_VAR}={pair.public_path}")
    print("Kubernetes (namespace podium):")
    print(
        "  kubectl -n podium create secret generic podium-policy-signing-key "
        f"--from-file=signing-key.pem={pair.private_path} --dry-run=client -o yaml | kubectl apply -f -"
    )
    print(
        "  kubectl -n podium create secret generic podium-policy-trusted-keys "
        f"--from-file={pair.key_id}.pub={pair.public_path} --dry-run=client -o yaml | kubectl apply -f -"
    )
    return 0
