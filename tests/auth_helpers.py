"""Helpers of the gRPC authentication tests: throwaway TLS material and token tables.

(A module with a unique name rather than conftest.py, so test modules can import it.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from podium.service.auth import token_digest
from podium_app.kafka_auth import make_tls


@dataclass(frozen=True)
class GrpcTls:
    """A CA and a server certificate for 127.0.0.1/localhost."""

    ca: Path
    cert: Path
    key: Path


def make_grpc_tls(directory: Path) -> GrpcTls:
    """Fresh TLS material in ``directory`` (the broker tooling's ``openssl`` recipe: a CA of
    its own and a server certificate for 127.0.0.1 and localhost)."""
    files = make_tls(directory)
    return GrpcTls(files.ca, directory / "broker.pem", directory / "broker.key")


def write_tokens(path: Path, tokens: dict[str, tuple[str, list[str]]]) -> Path:
    """A token table file: ``{name: (token, roles)}`` stored as sha256 digests."""
    table = {
        "tokens": [
            {"name": name, "sha256": token_digest(token), "roles": roles}
            for name, (token, roles) in tokens.items()
        ]
    }
    path.write_text(json.dumps(table))
    return path
