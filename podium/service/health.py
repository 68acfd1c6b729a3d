"""A ``grpc.health.v1`` server on its own port: what Kubernetes ``grpc:`` probes ask.

Every standalone service runs one (:func:`podium.service.serve` starts it), whether or not it
has a gRPC API of its own: a sub-agent worker or a learner only speaks to the bus, yet the
cluster still needs to know whether it is up. The status is NOT_SERVING while the app starts,
SERVING once ``app.start()`` has returned, and NOT_SERVING again from the moment it begins
to stop, so a readiness probe drains it before it leaves.
"""

from __future__ import annotations

import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from podium.config import HEALTH_PORT_ENV
from podium.errors import ConfigError

ALL_INTERFACES = "[::]"
"""Bind address: every interface, IPv6 and IPv4 (a probe comes from the node, not loopback)."""


def health_status(serving: bool) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    """SERVING or NOT_SERVING."""
    return (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )


class HealthServer:
    """A grpc.aio server carrying only ``grpc.health.v1.Health``.

    It answers for the whole server (service ``""``, what a probe without a service name
    asks) and for each name in ``services`` (e.g. ``"subagent_svc"``).
    """

    def __init__(
        self, port: int, *, host: str = ALL_INTERFACES, services: tuple[str, ...] = ()
    ) -> None:
        """Nothing is bound until :meth:`start` (a grpc.aio server belongs to the event loop
        it is started in). ``port`` 0 = a free port chosen by the OS."""
        self.address = f"{host}:{port}"
        self.requested_port = port
        """The port asked for (0 = any free one)."""
        self.names = ("", *services)
        self.port = 0
        """The bound port (0 before :meth:`start`)."""
        self.servicer = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Bind and serve, reporting NOT_SERVING; returns the bound port.

        Raises :class:`ConfigError` naming ``PODIUM_HEALTH_PORT`` when the address cannot be
        bound (most often: another process holds the port).
        """
        # No SO_REUSEPORT (gRPC's default): a second process on the same port must fail here
        # rather than share the port and answer half of the probes meant for the first.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        try:
            port = int(server.add_insecure_port(self.address))
        except RuntimeError as exc:  # grpcio >= 1.60 raises; older versions return 0
            port = 0
            reason = str(exc)
        else:
            reason = "no port bound"
        if port == 0:
            raise ConfigError(
                f"{HEALTH_PORT_ENV}={self.requested_port}: cannot serve grpc.health.v1 on "
                f"{self.address} ({reason}); is the port taken by another process?"
            )
        await server.start()
        self._server = server
        self.port = port
        await self.set_serving(False)
        return port

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for every name this server answers for."""
        status = health_status(serving)
        for name in self.names:
            await self.servicer.set(name, status)

    async def stop(self, grace_s: float = 1.0) -> None:
        """NOT_SERVING, then stop; a probe in flight gets up to ``grace_s`` to be answered."""
        if self._server is None:
            return
        await self.set_serving(False)
        await self._server.stop(grace_s)
        self._server = None
