"""Bearer-token authentication with roles for Podium's grpc.aio servers.

Clients present ``authorization: Bearer <token>`` metadata on every call; the server keeps
only the sha256 of each token (a :class:`TokenTable`, loaded from the file
``PODIUM_GRPC_TOKENS`` names: typically a mounted Kubernetes Secret), so a leaked table
grants nothing. Each token has a name (the *principal*: what the services record, e.g. as a
session's ``submitted_by``) and roles:

* ``plugin``: IDE plugins and other clients; submit sessions and read their own;
* ``reviewer``: humans approving or rejecting sensitive subtasks (ReviewService);
* ``operator``: drive rollouts (RolloutService).

:class:`AuthInterceptor` maps each method (``/pkg.Service/Method``, or ``/pkg.Service/*``) to
the role it needs: no token or an unknown one is ``UNAUTHENTICATED``, a known token without
the role ``PERMISSION_DENIED``; health checks and reflection need none. Handlers read the
caller with :func:`principal`.

Bearer tokens must not travel in clear: :func:`server_security` refuses tokens without TLS
(``PODIUM_GRPC_TLS_CERT`` / ``PODIUM_GRPC_TLS_KEY``) unless ``PODIUM_GRPC_PLAINTEXT_TOKENS``
allows it, and then only on a loopback address (tests). Without ``PODIUM_GRPC_TOKENS``
authentication is off (the behaviour before it existed), with a warning naming the setting.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import yaml

from podium.config import env
from podium.errors import ConfigError

_log = logging.getLogger(__name__)

ROLES = ("plugin", "reviewer", "operator")
"""Every role a token may hold."""
PLUGIN, REVIEWER, OPERATOR = ROLES

TOKENS_SETTING = "PODIUM_GRPC_TOKENS"
"""Setting naming the token table file."""
CERT_SETTING = "PODIUM_GRPC_TLS_CERT"
"""Setting naming the server's PEM certificate (chain)."""
KEY_SETTING = "PODIUM_GRPC_TLS_KEY"
"""Setting naming the server's PEM private key."""
PLAINTEXT_SETTING = "PODIUM_GRPC_PLAINTEXT_TOKENS"
"""Setting that allows tokens without TLS on a loopback address (tests only)."""

AUTHORIZATION = "authorization"
"""Metadata key of the bearer token (lower case, as gRPC requires)."""

OPEN_METHODS = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Method prefixes served without a token: probes and load balancers must reach health, and
reflection only describes the public contract."""

_PRINCIPAL: contextvars.ContextVar[str] = contextvars.ContextVar("podium_principal", default="")


def token_digest(token: str) -> str:
    """The sha256 of ``token`` in lower-case hex: what a token table stores."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One token of the table."""

    name: str
    """The principal the token authenticates (recorded as e.g. a session's submitter)."""
    sha256: str
    """sha256 of the token, 64 lower-case hex digits (never the token itself)."""
    roles: frozenset[str]
    """Roles it holds, a subset of :data:`ROLES`."""


class TokenTable:
    """The tokens a server accepts, by digest. Build with :meth:`load` or :meth:`parse`."""

    def __init__(self, entries: Sequence[TokenEntry]) -> None:
        self.entries = tuple(entries)
        self._by_digest = {e.sha256: e for e in self.entries}

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def load(cls, path: str | Path, *, setting: str = TOKENS_SETTING) -> TokenTable:
        """The table in file ``path`` (YAML or JSON ``{tokens: [{name, sha256, roles}]}``);
        ConfigError naming ``setting`` and the field for anything unreadable or invalid."""
        where = f"{setting}={str(path)!r}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the token table: {exc}") from exc
        try:
            raw = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{where}: not valid YAML/JSON: {exc}") from exc
        return cls.parse(raw, where)

    @classmethod
    def parse(cls, raw: object, where: str = TOKENS_SETTING) -> TokenTable:
        """The table of an already-parsed document; ConfigError naming ``where`` and the field."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("tokens"), list):
            raise ConfigError(f"{where}: expected a mapping with a list under 'tokens'")
        unknown = set(raw) - {"tokens"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {sorted(map(str, unknown))}")
        entries = [_entry(item, f"{where}: tokens[{i}]") for i, item in enumerate(raw["tokens"])]
        if not entries:
            raise ConfigError(f"{where}: tokens is empty (unset the setting to turn auth off)")
        for field in ("name", "sha256"):
            seen: set[str] = set()
            for i, e in enumerate(entries):
                value = getattr(e, field)
                if value in seen:
                    raise ConfigError(f"{where}: tokens[{i}].{field}: duplicate {value!r}")
                seen.add(value)
        return cls(entries)

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry of ``token``, or None if the table does not hold it."""
        digest = token_digest(token)
        entry = self._by_digest.get(digest)
        # The dict lookup found the candidate; the comparison itself is constant-time.
        if entry is not None and hmac.compare_digest(entry.sha256, digest):
            return entry
        return None


def _entry(item: object, where: str) -> TokenEntry:
    """One table entry, validated; ConfigError naming ``where`` and the field."""
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected a mapping with name, sha256 and roles")
    unknown = set(item) - {"name", "sha256", "roles"}
    if unknown:
        hint = " (store sha256 of the token, never the token)" if "token" in unknown else ""
        raise ConfigError(f"{where}: unknown key(s) {sorted(map(str, unknown))}{hint}")
    name, digest, roles = item.get("name"), item.get("sha256"), item.get("roles")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ConfigError(f"{where}.name: expected a non-empty string of at most 200 characters")
    if (
        not isinstance(digest, str)
        or len(digest) != 64
        or not all(c in "0123456789abcdef" for c in digest.lower())
    ):
        raise ConfigError(f"{where}.sha256: expected 64 hex digits (sha256 of the token)")
    if isinstance(roles, str):
        roles = [roles]
    if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
        raise ConfigError(f"{where}.roles: expected a non-empty list of {', '.join(ROLES)}")
    bad = sorted(set(roles) - set(ROLES))
    if bad:
        raise ConfigError(f"{where}.roles: unknown role(s) {bad}; known: {', '.join(ROLES)}")
    return TokenEntry(name.strip(), digest.lower(), frozenset(roles))


def principal(context: object = None) -> str:
    """The authenticated caller of the RPC being handled ("" when authentication is off).

    ``context`` (the handler's ServicerContext) is accepted for readability at call sites;
    the principal travels in a context variable that :class:`AuthInterceptor` sets around
    the handler, since grpc.aio contexts cannot carry attributes.
    """
    del context
    return _PRINCIPAL.get()


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` entry, or None."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION:
            continue
        text = value.decode() if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Authenticates every call and checks its method's role (see the module docstring).

    ``method_roles`` maps ``/pkg.Service/Method`` or ``/pkg.Service/*`` to a role; a method
    it does not cover (and that is not health or reflection) is refused to everyone:
    forgetting a method must not open it.
    """

    def __init__(self, table: TokenTable, method_roles: Mapping[str, str]) -> None:
        bad = sorted({r for r in method_roles.values() if r not in ROLES})
        if bad:
            raise ConfigError(f"AuthInterceptor: unknown role(s) {bad}; known: {ROLES}")
        self.table = table
        self.method_roles = dict(method_roles)

    def role_for(self, method: str) -> str | None:
        """The role ``method`` needs, or None if no entry covers it."""
        role = self.method_roles.get(method)
        if role is None:
            service = method.rsplit("/", 1)[0]
            role = self.method_roles.get(f"{service}/*")
        return role

    def check(self, method: str, metadata: Sequence[tuple[str, Any]] | None) -> _Outcome:
        """Who may call ``method`` with ``metadata``: the principal, or the refusal."""
        if method.startswith(OPEN_METHODS):
            return _Outcome("", None, "")
        token = bearer_token(metadata)
        if token is None:
            return _Outcome(
                "", grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer <token>'"
            )
        entry = self.table.lookup(token)
        if entry is None:
            return _Outcome("", grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token")
        role = self.role_for(method)
        if role is None:
            return _Outcome(entry.name, grpc.StatusCode.PERMISSION_DENIED, f"{method} is closed")
        if role not in entry.roles:
            held = ", ".join(sorted(entry.roles))
            return _Outcome(
                entry.name,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{entry.name!r} (roles: {held}) lacks the role {role!r} that {method} needs",
            )
        return _Outcome(entry.name, None, "")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        outcome = self.check(
            str(handler_call_details.method), handler_call_details.invocation_metadata
        )
        if outcome.code is not None:
            return _rewrap(handler, _refuse(outcome.code, outcome.message))
        return _rewrap(handler, _as_principal(outcome.principal))


@dataclass(frozen=True, slots=True)
class _Outcome:
    principal: str
    code: grpc.StatusCode | None
    message: str


Wrap = Callable[[Behaviour, bool], Behaviour]
"""Turns a handler's behaviour into another; the flag says whether it streams responses."""


def _rewrap(handler: grpc.RpcMethodHandler, wrap: Wrap) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour replaced by ``wrap(behaviour, streams)``."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
    )
    for attr, build, streams in kinds:
        behaviour = getattr(handler, attr)
        if behaviour is not None:
            return build(  # type: ignore[no-any-return]
                wrap(behaviour, streams),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def _refuse(code: grpc.StatusCode, message: str) -> Wrap:
    """A wrap whose behaviour aborts the call with ``code``."""

    def wrap(behaviour: Behaviour, streams: bool) -> Behaviour:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(code, message)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await context.abort(code, message)
            yield  # pragma: no cover - abort raises; this makes the function a generator

        return stream if streams else unary

    return wrap


def _as_principal(name: str) -> Wrap:
    """A wrap running the behaviour with :func:`principal` returning ``name``."""

    def wrap(behaviour: Behaviour, streams: bool) -> Behaviour:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = _PRINCIPAL.set(name)
            try:
                return await behaviour(request, context)
            finally:
                _PRINCIPAL.reset(token)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            _PRINCIPAL.set(name)  # the generator runs in the call's own task: no reset needed
            async for item in behaviour(request, context):
                yield item

        return stream if streams else unary

    return wrap


# --------------------------------------------------------------------------- server side


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``, brackets allowed) is a loopback one."""
    h = host.strip().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def server_credentials(cert: str | Path, key: str | Path) -> grpc.ServerCredentials:
    """TLS credentials from PEM files (``PODIUM_GRPC_TLS_CERT`` / ``PODIUM_GRPC_TLS_KEY``);
    ConfigError naming the setting whose file cannot be read."""
    material: dict[str, bytes] = {}
    for setting, path in ((CERT_SETTING, cert), (KEY_SETTING, key)):
        try:
            material[setting] = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{setting}={str(path)!r}: cannot read: {exc}") from exc
        if b"-----BEGIN" not in material[setting]:
            raise ConfigError(f"{setting}={str(path)!r}: not a PEM file")
    return grpc.ssl_server_credentials([(material[KEY_SETTING], material[CERT_SETTING])])


@dataclass(frozen=True)
class ServerSecurity:
    """How a gRPC server authenticates: the token table (None: auth off) and its TLS
    credentials (None: plaintext). Build with :func:`server_security`."""

    table: TokenTable | None
    """Accepted tokens; None when ``PODIUM_GRPC_TOKENS`` is unset."""
    credentials: grpc.ServerCredentials | None
    """TLS credentials; None for a plaintext port."""

    def interceptors(self, method_roles: Mapping[str, str]) -> list[grpc.aio.ServerInterceptor]:
        """The auth interceptor for ``method_roles`` (none when auth is off)."""
        return [] if self.table is None else [AuthInterceptor(self.table, method_roles)]

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Add the listening port (TLS when configured); returns the bound port."""
        if self.credentials is not None:
            return int(server.add_secure_port(address, self.credentials))
        return int(server.add_insecure_port(address))


@dataclass(frozen=True)
class GrpcSecurityConfig:
    """The security settings of a gRPC server, declared once: every service config that
    serves gRPC extends it (the orchestrator's SessionService + ReviewService, the rollout
    controller's RolloutService) and builds its :class:`ServerSecurity` with
    :meth:`server_security`."""

    grpc_tokens: str = env(TOKENS_SETTING, default="")
    """Token table file (a mounted Secret; YAML/JSON ``{tokens: [{name, sha256, roles}]}``,
    the sha256 of each token, never the token): gRPC callers must present ``authorization:
    Bearer <token>`` with a role the method needs (``plugin``, ``reviewer``, ``operator``).
    Empty: no authentication (a warning names this setting)."""
    grpc_tls_cert: str = env(CERT_SETTING, default="")
    """PEM certificate (chain) of the gRPC port; with ``PODIUM_GRPC_TLS_KEY`` the port is TLS.
    Required with ``PODIUM_GRPC_TOKENS``: bearer tokens never travel in clear."""
    grpc_tls_key: str = env(KEY_SETTING, default="")
    """PEM private key of the gRPC port's certificate."""
    grpc_plaintext_tokens: bool = env(PLAINTEXT_SETTING, default=False)
    """Tests only: accept ``PODIUM_GRPC_TOKENS`` without TLS, and only on a loopback
    address."""

    def server_security(self, host: str) -> ServerSecurity:
        """The security of this config's server listening on ``host`` (see
        :func:`server_security`)."""
        return server_security(
            tokens=self.grpc_tokens,
            tls_cert=self.grpc_tls_cert,
            tls_key=self.grpc_tls_key,
            plaintext_tokens=self.grpc_plaintext_tokens,
            host=host,
        )


def server_security(
    *, tokens: str, tls_cert: str, tls_key: str, plaintext_tokens: bool, host: str
) -> ServerSecurity:
    """The security of a server listening on ``host`` from its settings (see the module
    docstring); ConfigError naming the setting for every unsafe or invalid combination."""
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError(f"{CERT_SETTING} and {KEY_SETTING} must be set together")
    credentials = server_credentials(tls_cert, tls_key) if tls_cert else None
    if not tokens:
        _log.warning(
            "%s is not set: gRPC clients are not authenticated (anyone reaching the port may "
            "call every method)",
            TOKENS_SETTING,
        )
        return ServerSecurity(None, credentials)
    if credentials is None:
        if not plaintext_tokens:
            raise ConfigError(
                f"{TOKENS_SETTING} is set but {CERT_SETTING}/{KEY_SETTING} are not: bearer "
                f"tokens must not travel in clear (set {PLAINTEXT_SETTING}=1 only for tests "
                "on a loopback address)"
            )
        if not is_loopback(host):
            raise ConfigError(
                f"{PLAINTEXT_SETTING} allows tokens without TLS only on a loopback address, "
                f"not on {host!r}"
            )
        _log.warning("%s: bearer tokens without TLS on %s (tests only)", PLAINTEXT_SETTING, host)
    return ServerSecurity(TokenTable.load(tokens), credentials)


# --------------------------------------------------------------------------- client side


class _Bearer(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    """Adds the bearer token to every call of a plaintext (loopback) channel."""

    def __init__(self, token: str) -> None:
        self._value = f"Bearer {token}"

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*tuple(details.metadata or ()))
        metadata.add(AUTHORIZATION, self._value)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def client_channel(
    address: str,
    *,
    token: str | None,
    ca_file: str | Path | None,
    interceptors: Sequence[Any] = (),
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A channel to ``address``: TLS verified with ``ca_file`` when given, and ``token`` on
    every call as ``authorization: Bearer <token>``. A token without ``ca_file`` is refused
    (ConfigError) unless ``address`` is a loopback one (tests against a plaintext server)."""
    if ca_file:
        try:
            root = Path(ca_file).read_bytes()
        except OSError as exc:
            raise ConfigError(f"CA file {str(ca_file)!r}: cannot read: {exc}") from exc
        creds = grpc.ssl_channel_credentials(root_certificates=root)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token)
            )
        return grpc.aio.secure_channel(
            address, creds, options=list(options), interceptors=list(interceptors)
        )
    chain = list(interceptors)
    if token:
        host = address.rsplit(":", 1)[0]
        if not is_loopback(host):
            raise ConfigError(
                f"refusing to send a bearer token in clear to {address}: give the server's CA "
                "certificate to use TLS"
            )
        chain.append(_Bearer(token))
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=chain)


__all__ = [
    "AUTHORIZATION",
    "CERT_SETTING",
    "KEY_SETTING",
    "OPEN_METHODS",
    "OPERATOR",
    "PLAINTEXT_SETTING",
    "PLUGIN",
    "REVIEWER",
    "ROLES",
    "TOKENS_SETTING",
    "AuthInterceptor",
    "ServerSecurity",
    "TokenEntry",
    "TokenTable",
    "bearer_token",
    "client_channel",
    "is_loopback",
    "principal",
    "server_credentials",
    "server_security",
    "token_digest",
]
