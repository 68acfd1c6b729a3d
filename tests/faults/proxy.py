"""A TCP proxy between the services and the broker that a test can cut.

The broker advertises the proxy's address on its ``PROXIED`` listener
(``podium_app.kafka_broker.KafkaBroker.proxy_port``), so every client that bootstraps through
the proxy keeps talking through it after the metadata response. The proxy runs its own
asyncio loop in a daemon thread, so a test that blocks (or a stalled test loop) never stalls
the traffic, and the controls are plain thread-safe calls:

* :meth:`TcpProxy.blackhole`: a partition where packets are lost. Nothing is read or
  forwarded in either direction (bytes wait in the kernel's buffers, as TCP would retransmit
  them), new connections are accepted but go nowhere; clients see a silent peer and time out.
* :meth:`TcpProxy.cut`: every connection is reset and new ones are refused (reset at once),
  like a host that went away or a firewall that rejects.
* :meth:`TcpProxy.heal`: traffic flows again; connections that survived a blackhole resume
  where they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from concurrent.futures import Future


class TcpProxy:
    """Forward 127.0.0.1:``port`` to 127.0.0.1:``target_port``, with faults on demand."""

    def __init__(self, port: int = 0, target_port: int = 0) -> None:
        self.port = port
        """Listening port (0 picks a free one when started)."""
        self.target_port = target_port
        """Where connections go; may be set after start (read per new connection)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="proxy")
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._refusing = False
        self._transports: set[asyncio.WriteTransport] = set()
        self.connections = 0
        """Connections accepted so far (the broker's clients really go through the proxy)."""

    # -- control (any thread) -------------------------------------------------------------------

    def start(self) -> int:
        """Start listening; returns the port."""
        self._thread.start()
        return self._call(self._start())

    def stop(self) -> None:
        """Close every connection and the listener; stop the thread."""
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def blackhole(self) -> None:
        """Stop forwarding in both directions; connections stay open and silent."""
        self._call(self._set(flowing=False, refusing=False))

    def cut(self) -> None:
        """Reset every connection and refuse new ones until :meth:`heal`."""
        self._call(self._set(flowing=False, refusing=True))

    def heal(self) -> None:
        """Forward again."""
        self._call(self._set(flowing=True, refusing=False))

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` for clients."""
        return f"127.0.0.1:{self.port}"

    def _call(self, coro: object) -> int:
        future: Future[int] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(10)

    # -- inside the proxy's loop ------------------------------------------------------------------

    async def _start(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _stop(self) -> int:
        self._abort_all()
        if self._server is not None:
            self._server.close()
        return 0

    async def _set(self, *, flowing: bool, refusing: bool) -> int:
        assert self._flowing is not None
        self._refusing = refusing
        if refusing:
            self._abort_all()
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()
        return 0

    def _abort_all(self) -> None:
        for transport in list(self._transports):
            transport.abort()  # RST, not FIN: the peer learns at once
        self._transports.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        client = writer.transport
        if self._refusing:
            client.abort()
            return
        self._transports.add(client)
        try:
            await self._flowing.wait()  # a blackholed connection goes nowhere
            if self._refusing:
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client.abort()
            self._transports.discard(client)
            return
        self._transports.add(up_writer.transport)
        with contextlib.suppress(OSError):
            up_writer.transport.get_extra_info("socket").setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for transport in (client, up_writer.transport):
            self._transports.discard(transport)
            transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction while flowing; the first end or reset closes both directions."""
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                if writer.transport.is_closing():
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()
