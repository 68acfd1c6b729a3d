"""Where the policy runs: the ``PODIUM_POLICY_BACKEND`` value and its parsing (stdlib only).

Kept apart from :mod:`podium.serving.backends` (which imports torch and tritonclient) so that
service configs can validate the setting at start-up without importing either.
"""

from __future__ import annotations

from podium.config import is_port
from podium.errors import ConfigError

LOCAL = "local"
"""Backend spec of the in-process torch policy."""
V2_SCHEME = "v2://"
"""Prefix of a KServe-V2 gRPC server address in a backend spec."""


def parse_backend(spec: str) -> str | None:
    """``"local"`` -> None; ``"v2://host:port"`` -> ``"host:port"``; else :class:`ConfigError`."""
    text = spec.strip()
    if text == LOCAL:
        return None
    if text.startswith(V2_SCHEME):
        address = text[len(V2_SCHEME) :].rstrip("/")
        host, sep, port = address.rpartition(":")
        if sep and host and is_port(port):
            return address
    raise ConfigError(
        f"PODIUM_POLICY_BACKEND={spec!r} is invalid: expected 'local' or 'v2://HOST:PORT' "
        "(a KServe-V2 gRPC endpoint, e.g. v2://127.0.0.1:8001)"
    )


def policy_backend(raw: str) -> str:
    """``parse`` function of a ``PODIUM_POLICY_BACKEND`` config field: the checked spec."""
    parse_backend(raw)
    return raw.strip()


__all__ = ["LOCAL", "V2_SCHEME", "parse_backend", "policy_backend"]
