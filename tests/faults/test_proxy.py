"""The fault suite's own tools: the broker advertises the proxy, and the proxy's faults are the
faults they claim to be (otherwise every scenario would pass by missing the services)."""

from __future__ import annotations

import socket
import struct

import pytest
from harness import Cluster

from podium_app.kafka_broker import BrokerError, metadata_brokers

pytestmark = [pytest.mark.faults, pytest.mark.kafka]


def _metadata_via(port: int, timeout_s: float = 2.0) -> list[int]:
    return [p for _, _, p in metadata_brokers("127.0.0.1", port, timeout_s)]


async def test_broker_advertises_the_proxy_and_the_proxy_cuts(cluster: Cluster) -> None:
    proxy, broker = cluster.proxy, cluster.broker
    # Through the proxy the broker names the proxy, so clients stay behind it; its own
    # listener still names itself (inter-broker traffic and the readiness check).
    assert _metadata_via(proxy.port) == [proxy.port]
    assert _metadata_via(broker.port) == [broker.port]

    proxy.blackhole()  # silence: the request goes unanswered
    with pytest.raises((TimeoutError, socket.timeout)):
        _metadata_via(proxy.port, timeout_s=1.5)
    proxy.cut()  # refused: reset at once
    with pytest.raises((ConnectionError, OSError, struct.error, BrokerError)):
        _metadata_via(proxy.port, timeout_s=5.0)
    proxy.heal()
    assert _metadata_via(proxy.port) == [proxy.port]


async def test_a_blackholed_connection_resumes_after_heal(cluster: Cluster) -> None:
    proxy = cluster.proxy
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        proxy.blackhole()
        # Metadata v1 request (see kafka_broker.metadata_brokers): sent into the silence.
        body = struct.pack(">hhi", 3, 1, 9) + struct.pack(">h", 1) + b"x" + struct.pack(">i", -1)
        sock.sendall(struct.pack(">i", len(body)) + body)
        sock.settimeout(1.0)
        with pytest.raises((TimeoutError, socket.timeout)):
            sock.recv(4)
        proxy.heal()
        sock.settimeout(10.0)
        size = struct.unpack(">i", sock.recv(4))[0]
        assert size > 0  # the same connection got its answer, nothing was lost on the way
