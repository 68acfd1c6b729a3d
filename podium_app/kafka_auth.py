"""Authentication and authorization of the local Kafka broker: TLS material, SCRAM principals
and ACLs, plus the few Kafka requests the tooling sends itself.

The dev broker (:mod:`podium_app.kafka_broker`) serves clients only on a ``SASL_SSL`` listener
with ``SCRAM-SHA-512``, authorizes with KRaft's ``StandardAuthorizer`` and
``allow.everyone.if.no.acl.found=false``. This module holds what that needs:

* :func:`make_tls`: a CA and a broker certificate (``openssl``), per broker directory;
* :data:`SERVICES` and :func:`service_grants`: one principal per service and exactly the ACLs
  it needs (the same table as the Strimzi ``KafkaUser`` resources in ``k8s/base/kafka.yaml``);
* :class:`Login` and :func:`open_connection`: a Kafka connection over TLS, authenticated with
  SCRAM-SHA-512 (RFC 5802/7677), used by the readiness check and to create the ACLs — so the
  tooling needs neither a JVM round trip nor a Python Kafka client.

Standard library only (like kafka_broker), so ``scripts/kafka.sh`` runs without a venv.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from podium import topics
from podium.errors import PodiumError

ADMIN_USER = "admin"
"""Super user of the dev broker: tests and tooling (any topic, group, ACL)."""
SCRAM_MECHANISM = "SCRAM-SHA-512"
"""The one SASL mechanism of the client listener."""

SERVICES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "orchestrator": (
        (
            topics.TASKS,
            topics.SUBTASK_RESULTS,
            topics.SCORED_TRAJECTORIES,
            topics.POLICY_UPDATES,
            topics.ORCHESTRATOR_SESSIONS,
            topics.ROLLOUT,
            topics.REVIEWS,
            topics.TRAJECTORIES,
        ),
        (
            topics.TASKS,
            topics.SUBTASKS_ASSIGNED,
            topics.TRAJECTORIES,
            topics.FEEDBACK,
            topics.ORCHESTRATOR_SESSIONS,
            topics.REVIEWS,
        ),
    ),
    "subagent": ((topics.SUBTASKS_ASSIGNED,), (topics.SUBTASK_RESULTS,)),
    "reward": ((topics.TRAJECTORIES,), (topics.SCORED_TRAJECTORIES,)),
    "learner": (
        (topics.SCORED_TRAJECTORIES, topics.ROLLOUT, topics.POLICY_UPDATES),
        (topics.POLICY_UPDATES,),
    ),
    "rollout": (
        (topics.SCORED_TRAJECTORIES, topics.TRAJECTORIES, topics.POLICY_UPDATES, topics.ROLLOUT),
        (topics.ROLLOUT,),
    ),
}
"""Principal name -> (topics it consumes, topics it produces), from docs/architecture.md.
The orchestrator also creates, writes and reads its session ledger
(:data:`~podium.topics.ORCHESTRATOR_SESSIONS`), and reads back the trajectories it writes (every
replica's, into its statistics store of the sub-agents, ``PODIUM_AGENT_STATS``).
The principal's consumer groups and transactional ids are those that start with its name
(``reward`` covers reward_svc's default group ``reward_svc`` and ids ``reward_svc-<pod>``).
``rollout`` is the rollout controller (learner_svc in ``rollout`` mode, the one writer of
:data:`~podium.topics.ROLLOUT`); the orchestrator and the learner read the rollout state.
The learner reads the policy updates too: a reset to the live version loads that version's
signed announcement (learner_svc/lineage.py)."""


class AuthError(PodiumError):
    """The broker refused a login or an ACL, or TLS material could not be made."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One ALLOW ACL for ``User:principal`` on every resource whose name starts with ``prefix``."""

    principal: str
    """SCRAM user name (the ACL principal is ``User:<principal>``)."""
    resource: str
    """TOPIC, GROUP or TRANSACTIONAL_ID."""
    prefix: str
    """Resource name prefix (a PREFIXED pattern: a run's private ``<topic>.<tag>`` is covered)."""
    operation: str
    """READ, WRITE, CREATE or DESCRIBE."""


def service_grants(service: str) -> list[Grant]:
    """The ACLs of ``service``'s principal: read (and describe, create) what it consumes,
    write the dead-letter topics of those, write what it produces, and use its own consumer
    groups and transactional ids. Nothing else: e.g. reward may not write policy updates."""
    if service not in SERVICES:
        raise AuthError(f"unknown service principal {service!r}; known: {', '.join(SERVICES)}")
    consumed, produced = SERVICES[service]
    wanted: list[tuple[str, str, str]] = []
    for topic in consumed:
        wanted += [("TOPIC", topic, op) for op in ("READ", "DESCRIBE", "CREATE")]
        dlq = topics.dead_letter(topic)
        wanted += [("TOPIC", dlq, op) for op in ("WRITE", "DESCRIBE", "CREATE")]
    for topic in produced:
        wanted += [("TOPIC", topic, op) for op in ("WRITE", "DESCRIBE", "CREATE")]
    wanted += [("GROUP", service, op) for op in ("READ", "DESCRIBE")]
    wanted += [("TRANSACTIONAL_ID", service, op) for op in ("WRITE", "DESCRIBE")]
    return [Grant(service, r, p, op) for r, p, op in dict.fromkeys(wanted)]


def all_grants() -> list[Grant]:
    """Every service principal's ACLs."""
    return [g for service in SERVICES for g in service_grants(service)]


def new_password() -> str:
    """A random SCRAM password (URL-safe: no quoting needed in configs, URLs or env files)."""
    return secrets.token_urlsafe(24)


# -- TLS material ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of one broker directory's TLS."""

    ca: Path
    """The CA certificate: what clients verify the broker with (``ssl_cafile``)."""
    keystore: Path
    """Broker private key (unencrypted PKCS#8) followed by its certificate: Kafka's PEM keystore."""


def make_tls(tls_dir: Path) -> TlsFiles:
    """A CA and a broker certificate for 127.0.0.1/localhost in ``tls_dir`` (kept if present).

    A fresh CA per broker directory: nothing signed for one dev broker is trusted by another.
    EC P-256 keys, because generating them takes milliseconds.
    """
    files = TlsFiles(tls_dir / "ca.pem", tls_dir / "broker-keystore.pem")
    if files.ca.exists() and files.keystore.exists():
        return files
    tls_dir.mkdir(parents=True, exist_ok=True)
    ca_key, key, csr, cert = (
        tls_dir / n for n in ("ca.key", "broker.key", "broker.csr", "broker.pem")
    )
    ext = tls_dir / "broker.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(files.ca), "-days", "3650",
             "-subj", "/CN=podium-dev-kafka-ca")  # fmt: skip
    _openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "3650", "-extfile", str(ext))  # fmt: skip
    files.keystore.touch(mode=0o600)
    files.keystore.write_text(key.read_text() + cert.read_text())
    # Only the CA certificate is for everyone: clients (any user) verify the broker with it.
    for private in (ca_key, key, files.keystore):
        private.chmod(0o600)
    files.ca.chmod(0o644)
    return files


def _openssl(*args: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise AuthError("`openssl` is not on PATH; the broker's TLS certificates need it") from exc
    if done.returncode != 0:
        raise AuthError(f"openssl {args[0]} failed (exit {done.returncode}): {done.stderr[-800:]}")


# -- the Kafka wire, just enough for a readiness check and CreateAcls --------------------------


@dataclass(frozen=True, slots=True)
class Login:
    """How the tooling connects: TLS verified with ``cafile``, SCRAM-SHA-512 as ``user``."""

    cafile: Path
    """CA certificate of the broker."""
    user: str
    """SCRAM user name."""
    password: str = ""
    """Its password; never logged."""

    def __repr__(self) -> str:
        return f"Login(cafile={str(self.cafile)!r}, user={self.user!r}, password=***)"


def string(text: str | None) -> bytes:
    """A Kafka (nullable) STRING: int16 length, then UTF-8."""
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _bytes(raw: bytes) -> bytes:
    return struct.pack(">i", len(raw)) + raw


class Reader:
    """Sequential decoding of a Kafka response body."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return tuple(int(v) for v in values)

    def string(self) -> str | None:
        (n,) = self.unpack(">h")
        if n < 0:
            return None
        text = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return text

    def bytes(self) -> bytes:
        (n,) = self.unpack(">i")
        raw = self.data[self.pos : self.pos + max(n, 0)]
        self.pos += max(n, 0)
        return raw


def request(sock: socket.socket, api_key: int, version: int, body: bytes) -> Reader:
    """Send one request (header v1: non-flexible versions only) and read its response body."""
    correlation = secrets.randbelow(2**31)
    header = struct.pack(">hhi", api_key, version, correlation) + string("podium-tooling")
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    reader = Reader(_recv_exact(sock, size))
    (got,) = reader.unpack(">i")
    if got != correlation:
        raise AuthError(f"unexpected correlation id {got} (sent {correlation})")
    return reader


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return buf


def open_connection(host: str, port: int, timeout_s: float, login: Login | None) -> socket.socket:
    """A connection to the broker: plaintext without ``login``, else TLS (verifying the broker
    against ``login.cafile``) and SCRAM-SHA-512 authentication. The caller closes it."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if login is None:
        return sock
    try:
        context = ssl.create_default_context(cafile=str(login.cafile))
        tls = context.wrap_socket(sock, server_hostname=host)
    except (OSError, ssl.SSLError):
        sock.close()
        raise
    try:
        scram_login(tls, login.user, login.password)
    except BaseException:
        tls.close()
        raise
    return tls


def scram_login(sock: socket.socket, user: str, password: str) -> None:
    """SaslHandshake v1 + two SaslAuthenticate v0 rounds of SCRAM-SHA-512; verifies the
    server's signature too. A refused login is an :class:`AuthError` naming the user."""
    shake = request(sock, 17, 1, string(SCRAM_MECHANISM))
    (code,) = shake.unpack(">h")
    if code != 0:
        raise AuthError(f"broker refused SASL mechanism {SCRAM_MECHANISM} (error {code})")
    nonce = base64.b64encode(secrets.token_bytes(18)).decode()
    name = user.replace("=", "=3D").replace(",", "=2C")
    first_bare = f"n={name},r={nonce}"
    server_first = _sasl_round(sock, user, b"n,," + first_bare.encode()).decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise AuthError(f"SCRAM login of {user!r}: the broker's nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = _hmac(salted, b"Client Key")
    without_proof = f"c=biws,r={fields['r']}"
    message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = _hmac(hashlib.sha512(client_key).digest(), message)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    server_final = _sasl_round(sock, user, f"{without_proof},p={proof.decode()}".encode())
    expected = base64.b64encode(_hmac(_hmac(salted, b"Server Key"), message))
    if server_final.decode() != f"v={expected.decode()}":
        raise AuthError(f"SCRAM login of {user!r}: the broker's signature is wrong")


def _sasl_round(sock: socket.socket, user: str, payload: bytes) -> bytes:
    reply = request(sock, 36, 0, _bytes(payload))
    (code,) = reply.unpack(">h")
    message = reply.string()
    if code != 0:
        raise AuthError(f"SCRAM authentication of {user!r} failed: {message or f'error {code}'}")
    return reply.bytes()


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha512).digest()


_RESOURCE = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
_OPERATION = {"READ": 3, "WRITE": 4, "CREATE": 5, "DESCRIBE": 8}
_PREFIXED, _ALLOW = 4, 3


def create_acls(sock: socket.socket, grants: list[Grant]) -> None:
    """CreateAcls v1 for ``grants`` on an authenticated (super user) connection.

    Idempotent: the broker keeps one copy of a binding created twice. Any refused binding is
    an :class:`AuthError` naming it.
    """
    body = struct.pack(">i", len(grants))
    for g in grants:
        body += struct.pack(">b", _RESOURCE[g.resource]) + string(g.prefix)
        body += struct.pack(">b", _PREFIXED) + string(f"User:{g.principal}") + string("*")
        body += struct.pack(">bb", _OPERATION[g.operation], _ALLOW)
    reply = request(sock, 30, 1, body)
    _throttle, count = reply.unpack(">ii")
    for grant in grants[:count]:
        (code,) = reply.unpack(">h")
        message = reply.string()
        if code != 0:
            raise AuthError(f"broker refused ACL {grant}: error {code} {message or ''}".strip())


__all__ = [
    "ADMIN_USER",
    "SCRAM_MECHANISM",
    "SERVICES",
    "AuthError",
    "Grant",
    "Login",
    "Reader",
    "TlsFiles",
    "all_grants",
    "create_acls",
    "make_tls",
    "new_password",
    "open_connection",
    "request",
    "scram_login",
    "service_grants",
    "string",
]
