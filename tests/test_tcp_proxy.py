"""The TCP proxy the fault tests put in front of MariaDB and the sandbox, checked against an echo server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from tests.conftest import ProxyFactory
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.faults

ANSWER_GUARD_SECONDS = 5.0  # only a broken proxy ever waits this long


class Echo:
    """An echo server that counts the connections it saw."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    server = Echo()
    server.server = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.server.close()
        await server.server.wait_closed()


@pytest.fixture
async def proxy(echo: Echo, tcp_proxy: ProxyFactory) -> TcpProxy:
    return await tcp_proxy("127.0.0.1", echo.port)


async def _connect(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), ANSWER_GUARD_SECONDS)


async def _is_dead(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Whether the connection was closed or reset under us (what a client of a cut peer sees)."""
    try:
        writer.write(b"anyone?")
        await writer.drain()
        return await asyncio.wait_for(reader.read(1024), ANSWER_GUARD_SECONDS) == b""
    except ConnectionError:
        return True


async def test_forwards_both_ways(proxy: TcpProxy, echo: Echo) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"ping") == b"ping"
    assert await _round_trip(reader, writer, "中文".encode()) == "中文".encode()
    writer.close()
    assert (proxy.accepted, echo.connections) == (1, 1)


async def test_cut_resets_open_and_new_connections_until_healed(proxy: TcpProxy, echo: Echo) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"before") == b"before"
    proxy.cut()
    assert await _is_dead(reader, writer)
    fresh_reader, fresh_writer = await _connect(proxy)
    assert await _is_dead(fresh_reader, fresh_writer)
    writer.close()
    fresh_writer.close()
    await proxy.until(lambda p: p.refused >= 1)
    assert echo.connections == 1  # the refused one never reached the target
    proxy.heal()
    healed_reader, healed_writer = await _connect(proxy)
    assert await _round_trip(healed_reader, healed_writer, b"after") == b"after"
    healed_writer.close()
    assert echo.connections == 2


async def test_blackhole_swallows_without_answering(proxy: TcpProxy, echo: Echo) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"one") == b"one"
    proxy.blackhole()
    writer.write(b"lost")
    await writer.drain()
    await proxy.until(lambda p: p.swallowed >= len(b"lost"))
    _, stranger_writer = await _connect(proxy)
    stranger_writer.write(b"hello?")
    await proxy.until(lambda p: p.swallowed >= len(b"lost") + len(b"hello?"))
    assert echo.connections == 1  # a blackholed newcomer is never put through
    proxy.heal()
    # "lost" never reached the echo server: the next answer holds only what was sent after the heal.
    assert await _round_trip(reader, writer, b"two") == b"two"
    writer.close()
    stranger_writer.close()


async def test_delay_holds_every_chunk_each_way(proxy: TcpProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.delay(0.1)
    started = time.perf_counter()
    assert await _round_trip(reader, writer, b"slow") == b"slow"
    assert time.perf_counter() - started >= 0.2  # 0.1 s out and 0.1 s back
    proxy.heal()
    assert proxy.delay_seconds == 0.0
    writer.close()


async def test_close_ends_every_connection(echo: Echo) -> None:
    proxy = TcpProxy("127.0.0.1", echo.port)
    await proxy.start()
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"x") == b"x"
    await proxy.close()
    assert await _is_dead(reader, writer)
    writer.close()
    with pytest.raises(OSError):
        await _connect(proxy)
