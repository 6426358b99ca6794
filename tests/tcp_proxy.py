"""A small asyncio TCP proxy for fault tests: put it between the service and MariaDB or the sandbox.

``cut()`` resets every connection and every new one (the peer is down), ``blackhole()`` accepts and
never answers (a peer that hangs: only timeouts help), ``delay(seconds)`` holds every chunk that long
in each direction (a slow link), ``heal()`` forwards normally again. The proxy keeps its port
throughout, so the service under test never needs to be told about a new address.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from enum import StrEnum

_CHUNK = 64 * 1024
_CLOSE_GRACE_SECONDS = 2.0


class Mode(StrEnum):
    OPEN = "open"
    CUT = "cut"
    BLACKHOLE = "blackhole"


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port``; see the module docstring."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = Mode.OPEN
        self.delay_seconds = 0.0
        self.accepted = 0  # connections forwarded to the target
        self.refused = 0  # connections reset on arrival while cut
        self.swallowed = 0  # bytes dropped while blackholed
        self._progress = asyncio.Event()  # set whenever a counter moves
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        """Reset every open connection; reset new ones as they arrive, until ``heal``."""
        self.mode = Mode.CUT
        self._abort_all()

    def blackhole(self) -> None:
        """Accept connections and swallow every byte, both ways, until ``heal``."""
        self.mode = Mode.BLACKHOLE

    def delay(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before passing it on (each direction)."""
        self.delay_seconds = seconds

    def heal(self) -> None:
        """Forward normally again (connections cut meanwhile stay closed: clients reconnect)."""
        self.mode = Mode.OPEN
        self.delay_seconds = 0.0

    async def until(self, predicate: Callable[[TcpProxy], bool]) -> None:
        """Return once ``predicate(self)`` holds (checked whenever a counter moves)."""
        while not predicate(self):
            self._progress.clear()
            await self._progress.wait()

    async def close(self) -> None:
        """Stop listening, reset every connection and wait for the handlers to end."""
        if self._server is not None:
            self._server.close()
        self._abort_all()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=_CLOSE_GRACE_SECONDS)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # --- plumbing -------------------------------------------------------------------------------

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()  # RST, not FIN: the peer sees a dead link, not a polite close
        self._writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._handle(client_reader, client_writer)
        finally:
            self._handlers.discard(handler)

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self.mode is Mode.CUT:
            self.refused += 1
            self._progress.set()
            client_writer.transport.abort()
            return
        self._writers.add(client_writer)
        if self.mode is Mode.BLACKHOLE:
            await self._swallow(client_reader)  # never connected upstream: never answered, even after heal
            self._writers.discard(client_writer)
            client_writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.add(upstream_writer)
        self.accepted += 1
        self._progress.set()
        await asyncio.gather(
            self._pump(client_reader, upstream_writer),
            self._pump(upstream_reader, client_writer),
        )

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy ``source`` to ``sink`` until either side goes away, obeying the current mode."""
        try:
            while chunk := await source.read(_CHUNK):
                if self.mode is Mode.BLACKHOLE:
                    self._swallowed(chunk)
                    continue
                if self.delay_seconds:
                    await asyncio.sleep(self.delay_seconds)
                if sink.transport.is_closing():
                    break
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            pass  # a cut, or the peer went away: the other pump sees it too
        finally:
            self._writers.discard(sink)
            with contextlib.suppress(Exception):
                sink.close()

    async def _swallow(self, source: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(_CHUNK):
                self._swallowed(chunk)

    def _swallowed(self, chunk: bytes) -> None:
        self.swallowed += len(chunk)
        self._progress.set()
