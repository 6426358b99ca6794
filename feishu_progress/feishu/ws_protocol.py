"""Feishu's long-connection protocol, without I/O: endpoint discovery, control and data frames.

What a client does (lark-oapi 1.7.5 ``lark_oapi/ws/client.py`` and oapi-sdk-go ``ws/`` agree):

1. ``POST <domain>/callback/ws/endpoint`` with ``{"AppID", "AppSecret"}`` (header ``locale: zh``); the
   domain is the app's Open API host (``https://open.feishu.cn``, Lark's ``https://open.larksuite.com``).
   Code 0 answers ``data.URL`` (a ``wss://`` URL whose query holds ``device_id`` and ``service_id``) and
   ``data.ClientConfig``; codes 1 (busy) and 1000040343 (internal error), or an HTTP status other than
   200, are Feishu's trouble; any other code refuses the app (10014: wrong secret).
2. A websocket to that URL; a refused handshake carries ``handshake-status``/``handshake-msg`` headers.
3. Every ``PingInterval`` s a control frame ``type=ping`` (``service`` = the URL's service_id); the pong
   may carry a new ClientConfig, which replaces the old one.
4. A data frame ``type=event`` (headers ``message_id``, ``trace_id``, ``sum``, ``seq``) holds the event
   JSON, or part ``seq`` of ``sum`` of it. The answer is the same frame with a ``biz_rt`` header (the
   handler's milliseconds) and the payload ``{"code": 200, "data": base64(reply JSON)}`` (500 when the
   handler failed). Both SDKs ignore other types (``card``); so do we.
5. After a drop, the first retry waits ``random() * ReconnectNonce`` s, later ones ``ReconnectInterval`` s.

``tests/test_ws_protocol.py`` checks these frames against the SDK's own generated class and encoder.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from feishu_progress.bounded import BoundedCache
from feishu_progress.feishu.ws_frames import Frame, Method, encode_frame

ENDPOINT_PATH = "/callback/ws/endpoint"
OK, SYSTEM_BUSY, INTERNAL_ERROR = 0, 1, 1000040343
FEISHU_TROUBLE_CODES = frozenset({SYSTEM_BUSY, INTERNAL_ERROR})
HEADER_TYPE, HEADER_MESSAGE_ID, HEADER_BIZ_RT = "type", "message_id", "biz_rt"
TYPE_PING, TYPE_PONG, TYPE_EVENT = "ping", "pong", "event"
ANSWER_OK, ANSWER_FAILED = 200, 500
# Bounds on what a gateway may ask (seconds): a broken or hostile one cannot make a client spin or sleep
# for ever.
MIN_INTERVAL, MAX_INTERVAL = 1, 3600
# A click is a few KB; these bound what an unfinished multi-part message may hold in memory.
MAX_PARTS = 64
MAX_ASSEMBLING = 64  # messages whose parts are still arriving
PART_TTL_SECONDS = 5.0  # the SDKs keep parts 5 s


class ProtocolError(ValueError):
    """A frame or an answer that does not follow the protocol."""


class DiscoveryRefused(Exception):
    """Endpoint discovery did not hand out a URL; ``feishu_trouble`` when Feishu, not the app, is at fault."""

    def __init__(self, code: int, message: str, *, feishu_trouble: bool) -> None:
        super().__init__(f"code {code}: {message}")
        self.code = code
        self.message = message
        self.feishu_trouble = feishu_trouble


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What Feishu tells the client about reconnecting and pinging (seconds; Feishu's defaults)."""

    reconnect_count: int = -1  # -1: forever (we always retry for ever: a service has no one to give up to)
    reconnect_interval: int = 120
    reconnect_nonce: int = 30  # the first retry waits random() * nonce seconds
    ping_interval: int = 120

    def to_json(self) -> dict[str, int]:
        return {
            "ReconnectCount": self.reconnect_count,
            "ReconnectInterval": self.reconnect_interval,
            "ReconnectNonce": self.reconnect_nonce,
            "PingInterval": self.ping_interval,
        }

    def updated(self, data: Any) -> ClientConfig:
        """This config with the fields ``data`` (Feishu's ``ClientConfig`` JSON) sets, each bounded."""
        if not isinstance(data, Mapping):
            return self
        changes: dict[str, int] = {}
        for key, name, low in (
            ("ReconnectInterval", "reconnect_interval", MIN_INTERVAL),
            ("ReconnectNonce", "reconnect_nonce", 0),
            ("PingInterval", "ping_interval", MIN_INTERVAL),
            ("ReconnectCount", "reconnect_count", -1),
        ):
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                changes[name] = min(max(value, low), MAX_INTERVAL)
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect, as discovery answered."""

    url: str
    device_id: str
    service_id: int
    config: ClientConfig


def endpoint_url(base_url: str) -> str:
    """The discovery URL of the app's Open API host (Feishu's, Lark's, the sandbox, a proxy)."""
    return base_url.rstrip("/") + ENDPOINT_PATH


def discovery_body(app_id: str, app_secret: str) -> dict[str, str]:
    return {"AppID": app_id, "AppSecret": app_secret}


def parse_endpoint(status: int, answer: Any, config: ClientConfig) -> Endpoint:
    """Discovery's answer → the endpoint; ``DiscoveryRefused`` (saying whose fault) otherwise."""
    body = answer if isinstance(answer, Mapping) else {}
    code, message = body.get("code"), str(body.get("msg") or "no message")
    if status != 200:
        raise DiscoveryRefused(status, f"HTTP {status}: {message}", feishu_trouble=True)
    if code != OK:
        trouble = code in FEISHU_TROUBLE_CODES or not isinstance(code, int)
        raise DiscoveryRefused(code if isinstance(code, int) else -1, message, feishu_trouble=trouble)
    data = body.get("data")
    url = data.get("URL") if isinstance(data, Mapping) else None
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        raise DiscoveryRefused(OK, "no websocket URL in the answer", feishu_trouble=True)
    query = parse_qs(urlsplit(url).query)
    device_id, service_id = query.get("device_id", [""])[0], query.get("service_id", [""])[0]
    if not device_id or not service_id.lstrip("-").isdigit():
        raise DiscoveryRefused(OK, "the websocket URL lacks device_id or service_id", feishu_trouble=True)
    assert isinstance(data, Mapping)
    return Endpoint(url, device_id, int(service_id), config.updated(data.get("ClientConfig")))


def ping_frame(service_id: int) -> bytes:
    return encode_frame(Frame(service=service_id, method=Method.CONTROL, headers=[(HEADER_TYPE, TYPE_PING)]))


def pong_config(frame: Frame, config: ClientConfig) -> ClientConfig:
    """The config a pong carries (the old one when it carries none or garbage)."""
    if frame.header(HEADER_TYPE) != TYPE_PONG or not frame.payload:
        return config
    try:
        return config.updated(json.loads(frame.payload))
    except ValueError:
        return config


def answer_frame(frame: Frame, code: int, reply: Mapping[str, Any] | None, elapsed_ms: int) -> bytes:
    """The answer to data frame ``frame``: itself, with ``biz_rt`` and the reply as its payload."""
    answer: dict[str, Any] = {"code": code}
    if reply is not None:
        answer["data"] = base64.b64encode(json.dumps(reply, ensure_ascii=False).encode("utf-8")).decode(
            "ascii"
        )
    payload = json.dumps(answer, ensure_ascii=False).encode("utf-8")
    headers = [*frame.headers, (HEADER_BIZ_RT, str(elapsed_ms))]
    return encode_frame(replace(frame, headers=headers, payload=payload))


class FragmentAssembler:
    """Joins the ``sum`` parts of a data frame's payload; bounded in parts, messages and time."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._parts: BoundedCache[str, tuple[float, list[bytes | None]]] = BoundedCache(
            MAX_ASSEMBLING, refresh_on_read=False
        )

    def add(self, frame: Frame) -> bytes | None:
        """The whole payload once every part arrived, else None; ``ProtocolError`` for a bad frame."""
        total, seq = _int_header(frame, "sum"), _int_header(frame, "seq")
        if not 1 <= total <= MAX_PARTS or not 0 <= seq < total:
            raise ProtocolError(f"part {seq} of {total}")
        payload = frame.payload or b""
        if total == 1:
            return self._bounded(payload)
        self._expire()
        message_id = frame.header(HEADER_MESSAGE_ID) or ""
        held = self._parts.get(message_id)
        if held is None:  # first part: stored once, so the cache's order is the order messages began
            held = (self._clock(), [None] * total)
            self._parts.put(message_id, held)
        parts = held[1]
        if len(parts) != total:
            raise ProtocolError(f"message {message_id!r} changed its number of parts")
        parts[seq] = payload
        joined = self._bounded(b"".join(part or b"" for part in parts), message_id)
        if any(part is None for part in parts):
            return None
        self._parts.pop(message_id)
        return joined

    def _bounded(self, payload: bytes, message_id: str | None = None) -> bytes:
        if len(payload) > self._max_bytes:
            if message_id is not None:
                self._parts.pop(message_id)
            raise ProtocolError(f"payload of {len(payload)} bytes exceeds {self._max_bytes}")
        return payload

    def _expire(self) -> None:
        now = self._clock()
        while (oldest := self._parts.oldest()) is not None and now - oldest[1][0] > PART_TTL_SECONDS:
            self._parts.pop(oldest[0])


def _int_header(frame: Frame, key: str) -> int:
    value = frame.header(key)
    if value is None or not value.lstrip("-").isdigit():
        raise ProtocolError(f"header {key!r} is {value!r}")
    return int(value)
