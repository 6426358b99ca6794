"""Feishu's long-connection side for the sandbox: endpoint discovery and the websocket gateway.

What a long-connection client (ours, ``feishu/ws.py``; lark-oapi's ``ws.Client`` 1.7.5) expects of
Feishu, and what this does (``feishu/ws_protocol.py`` is the client's half):

1. ``POST /callback/ws/endpoint`` with ``{"AppID", "AppSecret"}`` answers
   ``{"code": 0, "data": {"URL": "ws://…/ws/v2?device_id=…&service_id=…&ticket=…", "ClientConfig": {…}}}``.
   Wrong credentials: code 10014 (the client gives up). While ``available`` is False: HTTP 503
   (the client retries every ``ReconnectInterval`` s, after a random ``ReconnectNonce`` jitter).
2. ``GET /ws/v2`` upgrades to a websocket when the ticket came from a discovery (each is used once);
   otherwise 403 with the ``handshake-status``/``handshake-msg`` headers the client reads.
3. Control frames: the client pings every ``PingInterval`` s; the gateway answers a pong carrying the
   ClientConfig, from which the client re-configures itself (as Feishu does).
4. Data frames: a push is ``method=DATA`` with headers ``type=event``, ``message_id``, ``trace_id``,
   ``sum``, ``seq`` and the event JSON as payload, split into ``sum`` parts when it is longer than
   ``fragment_bytes``. The client answers with the same frame, payload
   ``{"code": 200|500, "data": base64(handler JSON)}``; ``Delivery.wait`` returns it decoded.

Delivery rules (sandbox decisions):

* Each push goes to one connection, round robin (Feishu: in cluster mode "只有其中随机一个客户端会收到").
* With no connection, pushes are queued and sent, in order, on the next connect: no lost click.
* A frame still unanswered when its connection closes is queued again and sent on the next connection
  (at least once, like Feishu's re-push of unacknowledged events); the service's dedupe turns such a
  second copy into a "duplicate" toast. A frame unanswered on a live connection is not resent:
  ``Delivery.wait`` times out, as Feishu would show the user its timeout error (200341).

Over the long connection there is no encryption or signature; the event header still carries the token.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import itertools
import json
import logging
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from feishu_progress.feishu.ws_frames import Frame, FrameError, Method, decode_frame, encode_frame
from feishu_progress.feishu.ws_protocol import ENDPOINT_PATH, ClientConfig

GATEWAY_PATH = "/ws/v2"
APP_SECRET_INVALID = 10014
SERVICE_ID = 33554678  # any int32; the client echoes it in its pings
CLOSE_TIMEOUT_SECONDS = 2.0  # a client that never answers our close must not stall the sandbox's shutdown

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FrameAnswer:
    """The client's answer frame for one push."""

    code: int  # 200, or 500 when the client's handler raised
    body: dict[str, Any] | None  # the handler's JSON (Feishu's callback reply), decoded from base64
    seconds: float  # from the last send of the frame to its answer
    sends: int  # how many times the frame was sent (more than 1 after a dropped connection)


@dataclass(eq=False, slots=True)
class Delivery:
    """One pushed event: queued, sent (maybe again after a drop), answered."""

    message_id: str
    payload: bytes
    answer: asyncio.Future[FrameAnswer]
    sends: int = 0
    sent_at: float | None = None

    async def wait(self, timeout: float) -> FrameAnswer:
        """The answer; ``TimeoutError`` after ``timeout`` s (the frame stays in flight)."""
        return await asyncio.wait_for(asyncio.shield(self.answer), timeout)


@dataclass(eq=False, slots=True)
class _Connection:
    device_id: str
    ws: web.WebSocketResponse
    in_flight: dict[str, Delivery] = field(default_factory=dict)
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class WsGateway:
    """The gateway's state and its two HTTP handlers; tests drive it through ``push``/``drop_all``."""

    def __init__(
        self,
        app_id: str | None,
        app_secret: str | None,
        client_config: ClientConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app_id = app_id
        self._app_secret = app_secret
        self.client_config = client_config or ClientConfig()  # replaceable: sent with the next pong
        self.available = True  # False: discovery answers 503, as during a Feishu outage
        self.answer_pings = True  # False: a silently dead gateway (the client sees no pong)
        self.fragment_bytes: int | None = None  # split longer payloads into sum/seq parts
        self.discoveries = 0  # endpoint-discovery requests, answered or refused
        self.connects = 0  # websocket connections accepted, ever
        self.pings = 0
        self._clock = clock
        self._tickets: set[str] = set()
        self._connections: dict[str, _Connection] = {}
        self._queue: deque[Delivery] = deque()
        self._device_ids = itertools.count(1)
        self._turn = itertools.count()
        self._closed = False

    @property
    def connection_count(self) -> int:
        """Open client connections."""
        return len(self._connections)

    @property
    def queued(self) -> int:
        """Pushes waiting for a connection."""
        return len(self._queue)

    def routes(self) -> list[web.RouteDef]:
        return [web.post(ENDPOINT_PATH, self.discover), web.get(GATEWAY_PATH, self.connect)]

    # ---- test controls ---------------------------------------------------------------------------

    async def push(self, event: Mapping[str, Any]) -> Delivery:
        """Send ``event`` (a ``card.action.trigger`` body) to one client, or queue it until one connects."""
        delivery = Delivery(
            message_id=uuid.uuid4().hex,
            payload=json.dumps(event, ensure_ascii=False).encode("utf-8"),
            answer=asyncio.get_running_loop().create_future(),
        )
        self._queue.append(delivery)
        await self._flush()
        return delivery

    async def drop_all(self) -> int:
        """Close every client connection (code 1001, going away); returns how many were open."""
        connections = list(self._connections.values())
        for connection in connections:
            await connection.ws.close(code=1001, message=b"sandbox gateway dropped the connection")
        return len(connections)

    async def close(self, app: web.Application | None = None) -> None:
        """Shut down: refuse new clients, close connections, cancel what was never answered."""
        self._closed = True
        await self.drop_all()
        for connection in list(self._connections.values()):
            self._requeue(connection)
        while self._queue:
            self._queue.popleft().answer.cancel()  # waiters see CancelledError: the gateway is gone

    # ---- HTTP handlers -----------------------------------------------------------------------------

    async def discover(self, request: web.Request) -> web.Response:
        """``POST /callback/ws/endpoint``: check the app's credentials, hand out a connection URL."""
        self.discoveries += 1
        if self._closed or not self.available:
            return web.json_response({"code": 1, "msg": "system busy"}, status=503)
        try:
            body = await request.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict) or not self._credentials_ok(body):
            return web.json_response({"code": APP_SECRET_INVALID, "msg": "app secret invalid"})
        ticket = secrets.token_hex(16)
        self._tickets.add(ticket)
        device_id = f"{next(self._device_ids)}-{uuid.uuid4().hex[:8]}"
        url = (
            request.url.with_scheme("ws")
            .with_path(GATEWAY_PATH)
            .with_query({"device_id": device_id, "service_id": str(SERVICE_ID), "ticket": ticket})
        )
        data = {"URL": str(url), "ClientConfig": self.client_config.to_json()}
        return web.json_response({"code": 0, "msg": "ok", "data": data})

    async def connect(self, request: web.Request) -> web.StreamResponse:
        """``GET /ws/v2``: the websocket; reads pings and answers until the client or the gateway closes."""
        ticket = request.query.get("ticket", "")
        if self._closed or ticket not in self._tickets or "device_id" not in request.query:
            return web.Response(
                status=403, headers={"handshake-status": "403", "handshake-msg": "invalid ticket"}
            )
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(timeout=CLOSE_TIMEOUT_SECONDS)
        await ws.prepare(request)
        connection = _Connection(request.query["device_id"], ws)
        self._connections[connection.device_id] = connection
        self.connects += 1
        try:
            await self._flush()
            await self._read(connection)
        finally:
            self._connections.pop(connection.device_id, None)
            self._requeue(connection)
            if not self._closed:
                await self._flush()
        return ws

    # ---- plumbing ----------------------------------------------------------------------------------

    def _credentials_ok(self, body: Mapping[str, Any]) -> bool:
        if self._app_id is None:
            return True
        return body.get("AppID") == self._app_id and body.get("AppSecret") == self._app_secret

    async def _read(self, connection: _Connection) -> None:
        async for message in connection.ws:
            if message.type is not WSMsgType.BINARY:
                continue  # the protocol is binary protobuf only
            try:
                frame = decode_frame(message.data)
            except FrameError as exc:
                log.warning("sandbox gateway: malformed frame from %s (%s)", connection.device_id, exc)
                continue
            if frame.method == Method.CONTROL:
                await self._on_control(connection, frame)
            elif frame.method == Method.DATA:
                self._on_answer(connection, frame)

    async def _on_control(self, connection: _Connection, frame: Frame) -> None:
        if frame.header("type") != "ping":
            return
        self.pings += 1
        if not self.answer_pings:
            return
        pong = Frame(
            service=frame.service,
            method=Method.CONTROL,
            headers=[("type", "pong")],
            payload=json.dumps(self.client_config.to_json()).encode("utf-8"),
        )
        await self._send_frames(connection, [pong])

    def _on_answer(self, connection: _Connection, frame: Frame) -> None:
        message_id = frame.header("message_id") or ""
        delivery = connection.in_flight.pop(message_id, None)
        if delivery is None or delivery.answer.done():
            return
        sent_at = delivery.sent_at if delivery.sent_at is not None else self._clock()
        code, body = _decode_answer(frame.payload or b"")
        delivery.answer.set_result(FrameAnswer(code, body, self._clock() - sent_at, delivery.sends))

    def _requeue(self, connection: _Connection) -> None:
        unanswered = [d for d in connection.in_flight.values() if not d.answer.done()]
        connection.in_flight.clear()
        if self._closed:
            for delivery in unanswered:
                delivery.answer.cancel()
            return
        self._queue.extendleft(reversed(unanswered))  # ahead of newer pushes, in their original order

    async def _flush(self) -> None:
        while self._queue and self._connections:
            connection = self._next_connection()
            delivery = self._queue.popleft()
            connection.in_flight[delivery.message_id] = delivery
            delivery.sends += 1
            delivery.sent_at = self._clock()
            try:
                await self._send_frames(connection, self._data_frames(delivery))
            except (ConnectionError, RuntimeError):
                # The connection is going away; its reader re-queues what it held.
                return

    def _next_connection(self) -> _Connection:
        connections = list(self._connections.values())
        return connections[next(self._turn) % len(connections)]

    def _data_frames(self, delivery: Delivery) -> list[Frame]:
        size = self.fragment_bytes or len(delivery.payload) or 1
        parts = [delivery.payload[i : i + size] for i in range(0, len(delivery.payload), size)] or [b""]
        trace_id = uuid.uuid4().hex
        return [
            Frame(
                seq_id=seq,
                service=SERVICE_ID,
                method=Method.DATA,
                headers=[
                    ("type", "event"),
                    ("message_id", delivery.message_id),
                    ("trace_id", trace_id),
                    ("sum", str(len(parts))),
                    ("seq", str(seq)),
                ],
                payload=part,
            )
            for seq, part in enumerate(parts)
        ]

    async def _send_frames(self, connection: _Connection, frames: list[Frame]) -> None:
        async with connection.send_lock:  # the parts of one message stay together
            for frame in frames:
                await connection.ws.send_bytes(encode_frame(frame))


def _decode_answer(payload: bytes) -> tuple[int, dict[str, Any] | None]:
    """``{"code": 200, "data": base64(JSON)}`` → (code, the JSON); anything malformed → (code or 0, None)."""
    with contextlib.suppress(ValueError):
        answer = json.loads(payload)
        if isinstance(answer, dict):
            code = answer.get("code")
            return (code if isinstance(code, int) else 0), _decode_data(answer.get("data"))
    return 0, None


def _decode_data(data: Any) -> dict[str, Any] | None:
    if not isinstance(data, str):
        return None
    try:
        decoded = json.loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None
    return decoded if isinstance(decoded, dict) else None
