"""podium.service.auth: token tables, the auth interceptor over real gRPC with TLS, and the
refusal to send bearer tokens in clear."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from podium.errors import ConfigError
from podium.service.auth import (
    TokenTable,
    client_channel,
    principal,
    server_security,
    token_digest,
)
from tests.auth_helpers import GrpcTls, make_grpc_tls, write_tokens

TOKENS = {
    "ide-alice": ("alice-secret", ["plugin"]),
    "bob": ("bob-secret", ["reviewer"]),
    "ops": ("ops-secret", ["operator", "reviewer"]),
}
ROLES = {"/test.Echo/Who": "plugin", "/test.Review/*": "reviewer"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> GrpcTls:
    return make_grpc_tls(tmp_path_factory.mktemp("tls"))


# --------------------------------------------------------------------------- token table


def test_table_holds_digests_and_roles(tmp_path: Path) -> None:
    table = TokenTable.load(write_tokens(tmp_path / "t.json", TOKENS))
    entry = table.lookup("ops-secret")
    assert entry is not None and entry.name == "ops"
    assert entry.roles == frozenset({"operator", "reviewer"})
    assert table.lookup("nope") is None
    assert table.lookup("") is None


def _bad(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "tokens.yaml"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        TokenTable.load(path)
    assert "PODIUM_GRPC_TOKENS" in str(err.value)
    return str(err.value)


def test_bad_tables_name_the_field(tmp_path: Path) -> None:
    digest = token_digest("x")
    assert "tokens[0].sha256" in _bad(tmp_path, {"tokens": [{"name": "a", "sha256": "ab", "roles": ["plugin"]}]})  # fmt: skip
    assert "tokens[0].roles" in _bad(tmp_path, {"tokens": [{"name": "a", "sha256": digest, "roles": ["admin"]}]})  # fmt: skip
    assert "tokens[0].name" in _bad(tmp_path, {"tokens": [{"sha256": digest, "roles": ["plugin"]}]})
    # A plain token in the file is refused with a hint, never accepted.
    msg = _bad(tmp_path, {"tokens": [{"name": "a", "token": "x", "sha256": digest, "roles": ["plugin"]}]})  # fmt: skip
    assert "never the token" in msg
    dup = {"name": "a", "sha256": digest, "roles": ["plugin"]}
    assert "tokens[1].name: duplicate" in _bad(tmp_path, {"tokens": [dup, {**dup, "sha256": token_digest("y")}]})  # fmt: skip
    assert "'tokens'" in _bad(tmp_path, ["not", "a", "mapping"])
    assert "empty" in _bad(tmp_path, {"tokens": []})
    with pytest.raises(ConfigError, match="cannot read"):
        TokenTable.load(tmp_path / "missing.yaml")


def test_tokens_without_tls_are_refused(tmp_path: Path, tls: GrpcTls) -> None:
    tokens = str(write_tokens(tmp_path / "t.json", TOKENS))
    with pytest.raises(ConfigError, match="PODIUM_GRPC_TLS_CERT"):
        server_security(tokens=tokens, tls_cert="", tls_key="", plaintext_tokens=False, host="127.0.0.1")  # fmt: skip
    with pytest.raises(ConfigError, match="loopback"):
        server_security(tokens=tokens, tls_cert="", tls_key="", plaintext_tokens=True, host="0.0.0.0")  # fmt: skip
    with pytest.raises(ConfigError, match="set together"):
        server_security(tokens=tokens, tls_cert=str(tls.cert), tls_key="", plaintext_tokens=False, host="0.0.0.0")  # fmt: skip
    with pytest.raises(ConfigError, match="PODIUM_GRPC_TLS_KEY"):
        server_security(tokens=tokens, tls_cert=str(tls.cert), tls_key=str(tmp_path / "no.key"), plaintext_tokens=False, host="0.0.0.0")  # fmt: skip
    ok = server_security(tokens=tokens, tls_cert="", tls_key="", plaintext_tokens=True, host="127.0.0.1")  # fmt: skip
    assert ok.table is not None and ok.credentials is None
    off = server_security(tokens="", tls_cert="", tls_key="", plaintext_tokens=False, host="0.0.0.0")  # fmt: skip
    assert off.table is None and off.interceptors(ROLES) == []
    with pytest.raises(ConfigError, match="in clear"):
        client_channel("10.1.2.3:50051", token="t", ca_file=None)


# --------------------------------------------------------------------------- over gRPC


async def _who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return principal(context).encode()


async def _stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(2):
        yield principal(context).encode()


def _handlers() -> list[grpc.GenericRpcHandler]:
    echo = grpc.method_handlers_generic_handler(
        "test.Echo",
        {
            "Who": grpc.unary_unary_rpc_method_handler(_who),
            "Closed": grpc.unary_unary_rpc_method_handler(_who),
        },
    )
    review = grpc.method_handlers_generic_handler(
        "test.Review", {"List": grpc.unary_stream_rpc_method_handler(_stream)}
    )
    return [echo, review]


@pytest.fixture
async def server(tmp_path: Path, tls: GrpcTls) -> AsyncIterator[int]:
    security = server_security(
        tokens=str(write_tokens(tmp_path / "tokens.yaml", TOKENS)),
        tls_cert=str(tls.cert),
        tls_key=str(tls.key),
        plaintext_tokens=False,
        host="127.0.0.1",
    )
    srv = grpc.aio.server(interceptors=security.interceptors(ROLES))
    srv.add_generic_rpc_handlers(_handlers())
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = security.bind(srv, "127.0.0.1:0")
    await srv.start()
    try:
        yield port
    finally:
        await srv.stop(0)


async def _call(port: int, tls: GrpcTls, token: str | None, method: str) -> list[bytes]:
    async with client_channel(f"127.0.0.1:{port}", token=token, ca_file=tls.ca) as channel:
        if method.endswith("List"):
            call = channel.unary_stream(method)(b"", timeout=10)
            return [item async for item in call]
        return [await channel.unary_unary(method)(b"", timeout=10)]


async def _code(port: int, tls: GrpcTls, token: str | None, method: str) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _call(port, tls, token, method)
    return err.value.code()


async def test_right_role_is_served_with_its_principal(server: int, tls: GrpcTls) -> None:
    assert await _call(server, tls, "alice-secret", "/test.Echo/Who") == [b"ide-alice"]
    assert await _call(server, tls, "ops-secret", "/test.Review/List") == [b"ops", b"ops"]


async def test_no_or_unknown_token_is_unauthenticated(server: int, tls: GrpcTls) -> None:
    assert await _code(server, tls, None, "/test.Echo/Who") == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(server, tls, "guess", "/test.Echo/Who") == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(server, tls, None, "/test.Review/List") == grpc.StatusCode.UNAUTHENTICATED


async def test_wrong_role_is_permission_denied(server: int, tls: GrpcTls) -> None:
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert await _code(server, tls, "bob-secret", "/test.Echo/Who") == denied
    assert await _code(server, tls, "alice-secret", "/test.Review/List") == denied
    # A method the role table forgot is closed to everyone, not open.
    assert await _code(server, tls, "ops-secret", "/test.Echo/Closed") == denied


async def test_health_needs_no_token(server: int, tls: GrpcTls) -> None:
    async with client_channel(f"127.0.0.1:{server}", token=None, ca_file=tls.ca) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_plaintext_client_is_refused_by_a_tls_server(server: int) -> None:
    async with client_channel(f"127.0.0.1:{server}", token="alice-secret", ca_file=None) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/test.Echo/Who")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_loopback_when_allowed(tmp_path: Path) -> None:
    security = server_security(
        tokens=str(write_tokens(tmp_path / "tokens.yaml", TOKENS)),
        tls_cert="",
        tls_key="",
        plaintext_tokens=True,
        host="127.0.0.1",
    )
    srv = grpc.aio.server(interceptors=security.interceptors(ROLES))
    srv.add_generic_rpc_handlers(_handlers())
    port = security.bind(srv, "127.0.0.1:0")
    await srv.start()
    try:
        async with client_channel(f"127.0.0.1:{port}", token="alice-secret", ca_file=None) as ch:
            assert await ch.unary_unary("/test.Echo/Who")(b"", timeout=10) == b"ide-alice"
    finally:
        await srv.stop(0)
