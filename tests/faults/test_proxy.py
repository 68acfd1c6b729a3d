"""The fault suite's own tools: the broker advertises the proxy, and the proxy's faults are the
faults they claim to be (otherwise every scenario would pass by missing the services).

The broker is secured (SCRAM over TLS), so every probe logs in as the admin first: through the
proxy that also proves the broker's certificate is valid for the address clients use there.
"""

from __future__ import annotations

import socket
import ssl
import struct

import pytest
from harness import Cluster

from podium_app.kafka_auth import AuthError, Login, open_connection, string
from podium_app.kafka_broker import BrokerError, metadata_brokers

pytestmark = [pytest.mark.faults, pytest.mark.kafka]


def _metadata_via(port: int, login: Login | None, timeout_s: float = 2.0) -> list[int]:
    return [p for _, _, p in metadata_brokers("127.0.0.1", port, timeout_s, login)]


async def test_broker_advertises_the_proxy_and_the_proxy_cuts(cluster: Cluster) -> None:
    proxy, broker = cluster.proxy, cluster.broker
    login = broker.login()
    assert login is not None, "the fault suite runs on the secured broker"
    # Through the proxy the broker names the proxy, so clients stay behind it; its own
    # listener still names itself (inter-broker traffic and the readiness check).
    assert _metadata_via(proxy.port, login) == [proxy.port]
    assert _metadata_via(broker.port, login) == [broker.port]
    # Both listeners are TLS + SCRAM: a plaintext client gets nothing through the proxy either.
    with pytest.raises((OSError, ValueError, struct.error)):
        _metadata_via(proxy.port, None)

    proxy.blackhole()  # silence: the handshake goes unanswered
    with pytest.raises((TimeoutError, socket.timeout)):
        _metadata_via(proxy.port, login, timeout_s=1.5)
    proxy.cut()  # refused: reset at once
    with pytest.raises((ConnectionError, OSError, struct.error, BrokerError, AuthError)):
        _metadata_via(proxy.port, login, timeout_s=5.0)
    proxy.heal()
    assert _metadata_via(proxy.port, login) == [proxy.port]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


async def test_a_blackholed_connection_resumes_after_heal(cluster: Cluster) -> None:
    proxy, login = cluster.proxy, cluster.broker.login()
    assert login is not None
    # A TLS session, logged in, through the proxy: then the silence falls on it.
    with open_connection("127.0.0.1", proxy.port, 5.0, login) as sock:
        assert isinstance(sock, ssl.SSLSocket)
        proxy.blackhole()
        # Metadata v1 request (see kafka_broker.metadata_brokers), correlation id 9.
        body = struct.pack(">hhi", 3, 1, 9) + string("x") + struct.pack(">i", -1)
        sock.sendall(struct.pack(">i", len(body)) + body)
        sock.settimeout(1.0)
        with pytest.raises((TimeoutError, socket.timeout)):
            sock.recv(4)
        proxy.heal()
        sock.settimeout(10.0)
        size = struct.unpack(">i", _recv_exact(sock, 4))[0]
        reply = _recv_exact(sock, size)
        # The same TLS session got its answer, nothing was lost or garbled on the way.
        assert struct.unpack(">i", reply[:4])[0] == 9
