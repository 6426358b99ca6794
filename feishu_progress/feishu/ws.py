"""Long connections (``mode = "ws"``): one per app, our own client over aiohttp, on the service's loop.

Each app in ws mode gets a ``LongConnection``: endpoint discovery on the app's own Open API host
(Feishu's, or Lark's ``open.larksuite.com`` for ``domain = "lark"``), one websocket, pings, and every
click answered by the same ``CallbackPipeline`` as the webhook (dedupe, the action handler within
2.5 s, Feishu's reply body), tagged with the connection's app. Each reconnects on its own schedule,
so one app's gateway going away leaves the others connected. ``feishu/ws_protocol.py`` holds the
protocol (what lark-oapi 1.7.5 and oapi-sdk-go speak), ``feishu/ws_frames.py`` the frame codec.

Why not lark-oapi's ``ws.Client`` (what this module ran before): its ``lark_oapi.ws.client`` keeps the
event loop in a module global that its coroutines read when they schedule work, so two clients in two
threads schedule onto one loop (lark-oapi #119) and one process could hold one connection. Besides,
its discovery is a blocking ``requests.post`` without a timeout (#169: a stop cannot interrupt it), it
has no ``stop()``, connection state needs three private methods overridden, ``import lark_oapi`` costs
~5 s and ~170 MB, and a click is answered only after the previous one. Here a stop is a task cancel,
discovery and the handshake have the app's timeout, clicks are answered concurrently, and a connection
silent for three ping intervals (lark-oapi #144: a dead TCP path) is dropped and made again.

Over the long connection Feishu itself is the peer: there is no signature, token or encryption to
check, and ``operator.user_id`` may be absent. Decisions where the SDKs differ or say nothing:

* A refused discovery (10014: wrong secret) is retried every ``ReconnectInterval`` (lark-oapi gives up):
  a service has nobody to hand the failure to but ``/readyz``, which says "refused" with Feishu's code.
* ``ReconnectCount`` is ignored: we retry for ever.
* An event that is not ``card.action.trigger`` (the app subscribed to more) is answered 200 without
  a body and logged; malformed JSON is answered 500 (what the SDKs answer when a handler fails).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from feishu_progress.background import BackgroundTasks
from feishu_progress.config import FeishuSettings
from feishu_progress.errors import CallbackRejected, ConfigError
from feishu_progress.feishu.callback import event_from_payload
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.ws_frames import Frame, FrameError, Method, decode_frame
from feishu_progress.feishu.ws_protocol import (
    ANSWER_FAILED,
    ANSWER_OK,
    HEADER_MESSAGE_ID,
    HEADER_TYPE,
    TYPE_EVENT,
    ClientConfig,
    DiscoveryRefused,
    Endpoint,
    FragmentAssembler,
    ProtocolError,
    answer_frame,
    discovery_body,
    endpoint_url,
    parse_endpoint,
    ping_frame,
    pong_config,
)
from feishu_progress.ports import Clock, SystemClock

SILENT_PING_INTERVALS = 3  # no frame for this many ping intervals: the connection is presumed dead
CLOSE_SECONDS = 1.0  # a gateway that never answers our close must not hold a reconnect or a stop
CARD_ACTION = "card.action.trigger"
DISCOVERY_HEADERS = {"locale": "zh"}  # what both SDKs send

log = logging.getLogger(__name__)

Send = Callable[[bytes], Awaitable[None]]
_ENDED = frozenset(
    {aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR}
)


class ConnectionState:
    """Whether the websocket is up, when the gateway last spoke, and why it is not up."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._connected = False
        self._changed_at: float | None = None  # None: never connected
        self._last_frame = 0.0
        self._ping_interval = 120.0
        self._refusal: str | None = None

    def connected(self, ping_interval: float) -> None:
        now = self._clock.monotonic()
        self._connected, self._changed_at, self._last_frame = True, now, now
        self._ping_interval, self._refusal = ping_interval, None

    def disconnected(self) -> None:
        if self._connected:
            self._connected, self._changed_at = False, self._clock.monotonic()

    def refused(self, reason: str) -> None:
        self._refusal = reason

    def frame_received(self, ping_interval: float) -> None:
        self._last_frame, self._ping_interval = self._clock.monotonic(), ping_interval

    def problem(self) -> str | None:
        """None while connected and the gateway spoke recently, else why not."""
        now = self._clock.monotonic()
        if not self._connected and self._refusal is not None:
            return f"endpoint discovery refused: {self._refusal} (retrying)"
        if self._changed_at is None:
            return "long connection not established yet"
        if not self._connected:
            return f"long connection down for {now - self._changed_at:.0f} s (reconnecting)"
        silent = now - self._last_frame
        if silent > SILENT_PING_INTERVALS * self._ping_interval:
            return f"no frame from the gateway for {silent:.0f} s (pings every {self._ping_interval:g} s)"
        return None


class LongConnection:
    """One app's long connection: discovery, the websocket, pings, answers; reconnects on its own."""

    def __init__(
        self,
        app: str,
        feishu: FeishuSettings,
        pipeline: CallbackPipeline,
        *,
        max_payload_bytes: int,
        observe: Callable[[float], None] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        secret = feishu.app_secret.get_secret_value() if feishu.app_secret is not None else ""
        if not feishu.app_id or not secret:
            raise ConfigError(f'app {app}: mode = "ws" needs its app_id and app_secret')
        self.app = app
        self._discovery = (endpoint_url(feishu.base_url), discovery_body(feishu.app_id, secret))
        self._timeout = feishu.timeout_seconds
        self._pipeline = pipeline
        self._observe = observe
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self.state = ConnectionState(self._clock)
        self.config = ClientConfig()  # Feishu's defaults until discovery (or a pong) says otherwise
        self._assembler = FragmentAssembler(max_payload_bytes)
        self._answers = BackgroundTasks()  # clicks being answered: drained at stop
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        """Connect in a task of the running loop (owned here: ``stop`` cancels it)."""
        self._task = asyncio.create_task(self._run(), name=f"long-connection-{self.app}")

    def problem(self) -> str | None:
        """For ``/readyz``: None when the connection is up and the gateway speaks, else why not."""
        if self._task is None or self._task.done():
            return "long-connection receiver is not running"
        return self.state.problem()

    async def stop(self, timeout: float) -> bool:
        """Stop taking clicks, let those being answered finish, close; True if done within ``timeout``."""
        self._stopping = True
        if self._task is None:
            return True
        await self._answers.drain(timeout)
        self._task.cancel()
        done, _ = await asyncio.wait({self._task}, timeout=timeout)
        return bool(done)

    async def _run(self) -> None:
        # No total timeout on the session: it would end the websocket too; each step has its own.
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            first_retry = True
            while True:
                try:
                    was_up = await self._connect_once(session)
                except Exception:  # a bug must not end the receiver: log it and reconnect
                    log.exception("app %s: long connection failed", self.app)
                    was_up = False
                first_retry = first_retry or was_up
                await self._clock.sleep(self._retry_delay(first_retry))
                first_retry = False

    def _retry_delay(self, first: bool) -> float:
        """Feishu's schedule: the first retry after a random part of the nonce, later ones every interval."""
        if first:
            return self._rng.random() * self.config.reconnect_nonce
        return float(self.config.reconnect_interval)

    async def _connect_once(self, session: aiohttp.ClientSession) -> bool:
        """One discovery and one websocket, served until it drops; True if it was up."""
        try:
            endpoint = await self._discover(session)
            async with asyncio.timeout(self._timeout):
                ws = await session.ws_connect(
                    endpoint.url, timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_SECONDS)
                )
        except DiscoveryRefused as refused:
            self._refused(refused)
            return False
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            log.warning("app %s: long connection not opened: %s", self.app, _describe(exc))
            return False
        try:
            await self._serve(ws, endpoint)
        finally:
            self.state.disconnected()
            await ws.close()
            log.log(
                logging.INFO if self._stopping else logging.WARNING,
                "app %s: long connection is down",
                self.app,
            )
        return True

    async def _discover(self, session: aiohttp.ClientSession) -> Endpoint:
        url, body = self._discovery
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        async with session.post(url, json=body, headers=DISCOVERY_HEADERS, timeout=timeout) as response:
            try:
                answer: Any = await response.json(content_type=None)
            except ValueError:
                answer = None
            endpoint = parse_endpoint(response.status, answer, self.config)
        self.config = endpoint.config
        return endpoint

    def _refused(self, refused: DiscoveryRefused) -> None:
        if refused.feishu_trouble:
            log.warning("app %s: endpoint discovery failed (%s): retrying", self.app, refused)
            return
        self.state.refused(str(refused))
        log.error(
            "app %s: endpoint discovery refused (%s): check the app's app_id/app_secret and that the "
            "developer console uses the long connection for callbacks; retrying every %d s",
            self.app,
            refused,
            self.config.reconnect_interval,
        )

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse, endpoint: Endpoint) -> None:
        self.state.connected(self.config.ping_interval)
        log.info("app %s: long connection is up (device %s)", self.app, endpoint.device_id)
        lock = asyncio.Lock()

        async def send(data: bytes) -> None:
            async with lock:  # an answer's bytes never interleave with a ping's
                await ws.send_bytes(data)

        # Owned here and cancelled below (background.py: a loop its owner cancels stays outside).
        pinger = asyncio.create_task(self._ping(send, endpoint.service_id), name=f"ws-ping-{self.app}")
        try:
            await self._read(ws, send)
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)

    async def _ping(self, send: Send, service_id: int) -> None:
        while True:
            try:
                await send(ping_frame(service_id))
            except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
                log.warning("app %s: ping not sent: %s", self.app, _describe(exc))
            await self._clock.sleep(self.config.ping_interval)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, send: Send) -> None:
        while True:
            silent_limit = SILENT_PING_INTERVALS * self.config.ping_interval
            try:
                message = await ws.receive(timeout=silent_limit)
            except TimeoutError:
                log.warning(
                    "app %s: no frame from the gateway for %d s: reconnecting", self.app, silent_limit
                )
                return
            if message.type in _ENDED:
                return
            if message.type is aiohttp.WSMsgType.BINARY:  # the protocol is binary protobuf only
                self.state.frame_received(self.config.ping_interval)
                self._on_frame(message.data, send)

    def _on_frame(self, data: bytes, send: Send) -> None:
        try:
            frame = decode_frame(data)
            if frame.method == Method.CONTROL:
                self.config = pong_config(frame, self.config)
                return
            payload = self._assembler.add(frame) if frame.method == Method.DATA else None
        except (FrameError, ProtocolError) as exc:
            log.warning("app %s: malformed frame from the gateway dropped: %s", self.app, exc)
            return
        if payload is None:
            return
        kind = frame.header(HEADER_TYPE)
        if kind != TYPE_EVENT:
            log.info("app %s: a %r frame was ignored (only events are answered)", self.app, kind)
        elif not self._stopping:  # else unanswered: Feishu pushes it again to a live connection
            message_id = (frame.header(HEADER_MESSAGE_ID) or "")[:64]
            self._answers.spawn(self._answer(frame, payload, send), name=f"ws-answer-{message_id}")

    async def _answer(self, frame: Frame, payload: bytes, send: Send) -> None:
        started = self._clock.monotonic()
        code, reply = await self._reply(payload)
        elapsed = self._clock.monotonic() - started
        if self._observe is not None:
            self._observe(elapsed)
        try:
            await send(answer_frame(frame, code, reply, round(elapsed * 1000)))
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            # Feishu pushes an unanswered event again; the dedupe answers that copy.
            log.warning("app %s: an answer was not sent (%s)", self.app, _describe(exc))

    async def _reply(self, payload: bytes) -> tuple[int, dict[str, Any] | None]:
        try:
            body = json.loads(payload)
        except ValueError:
            log.warning("app %s: an event that is not JSON was answered %d", self.app, ANSWER_FAILED)
            return ANSWER_FAILED, None
        header = body.get("header") if isinstance(body, dict) else None
        event_type = header.get("event_type") if isinstance(header, dict) else None
        if event_type != CARD_ACTION:
            log.info("app %s: event %r is not a card action: acknowledged, not handled", self.app, event_type)
            return ANSWER_OK, None
        try:
            event = dataclasses.replace(event_from_payload(body), app=self.app)
        except CallbackRejected as rejected:
            log.warning("app %s: card action rejected: %r", self.app, rejected.reason)
            return ANSWER_OK, self._pipeline.error_body()
        return ANSWER_OK, await self._pipeline.answer(event)


def _describe(exc: BaseException) -> str:
    """The reason, with the gateway's own words when a handshake was refused; never the URL's ticket."""
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        headers = exc.headers
        said = (headers.get("handshake-msg") if headers else None) or exc.message
        status = (headers.get("handshake-status") if headers else None) or ""
        return f"handshake refused: HTTP {exc.status} {status} {said}".replace("  ", " ")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
