"""Feishu Open API client on one shared aiohttp session, with an async single-flight token cache.

Only the calls the progress card needs: send, reply, PATCH, image upload, the CardKit card entity calls
(create, full update, settings, streamed text) and the tenant token.
Nothing here logs tokens, secrets or card bodies; log ids and codes are enough to ask Feishu.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp

from feishu_progress.config import FeishuSettings
from feishu_progress.errors import FeishuAPIError, FeishuProgressError, FeishuTransportError
from feishu_progress.feishu.errors import TOKEN_CODES
from feishu_progress.feishu.observe import WriteObserver
from feishu_progress.feishu.retry import FeishuRetryPolicy, with_retries
from feishu_progress.ports import Clock, SystemClock
from feishu_progress.shared_result import shared_work, wait_shared

log = logging.getLogger(__name__)

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES_PATH = "/open-apis/im/v1/messages"
IMAGES_PATH = "/open-apis/im/v1/images"
CARDS_PATH = "/open-apis/cardkit/v1/cards"
# Every write the client makes, by its budget's name (config.ApiLimits): its method and its route (the
# path with ids as placeholders), which a span carries as url.template.
WRITE_ROUTES: dict[str, tuple[str, str]] = {
    "send": ("POST", MESSAGES_PATH),
    "reply": ("POST", MESSAGES_PATH + "/{message_id}/reply"),
    "patch": ("PATCH", MESSAGES_PATH + "/{message_id}"),
    "image": ("POST", IMAGES_PATH),
    "card_create": ("POST", CARDS_PATH),
    "card_update": ("PUT", CARDS_PATH + "/{card_id}"),
    "card_settings": ("PATCH", CARDS_PATH + "/{card_id}/settings"),
    "card_content": ("PUT", CARDS_PATH + "/{card_id}/elements/{element_id}/content"),
}
DEFAULT_RENEW_MARGIN_SECONDS = 300.0
DEFAULT_POOL_LIMIT = 64
# Names the sending instance on Open API calls to anything but Feishu's or Lark's own hosts: the sandbox
# logs it, so a multi-instance test can tell which instance wrote a card. Feishu gets only its own headers.
INSTANCE_HEADER = "X-FP-Instance"
FEISHU_DOMAINS = ("feishu.cn", "larksuite.com", "larkoffice.com")


def is_feishu_host(base_url: str) -> bool:
    """True for Feishu's and Lark's own Open API hosts (and their subdomains)."""
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    return any(host == domain or host.endswith("." + domain) for domain in FEISHU_DOMAINS)


_PATH_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")

Json = dict[str, Any]


class TokenCache:
    """tenant_access_token with single-flight fetching: concurrent callers share one request."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[tuple[str, float]]],
        clock: Clock,
        renew_margin: float = DEFAULT_RENEW_MARGIN_SECONDS,
    ) -> None:
        self._fetch = fetch
        self._clock = clock
        self._renew_margin = renew_margin
        self._token: str | None = None
        self._renew_at = 0.0
        self._inflight: asyncio.Future[str] | None = None
        self.fetches = 0

    async def get(self) -> str:
        """A token valid for at least the renew margin, fetching one if needed."""
        if self._token is not None and self._clock.monotonic() < self._renew_at:
            return self._token
        if self._inflight is None:
            self._inflight = shared_work(self._refresh())
        return await wait_shared(self._inflight)

    def invalidate(self, rejected: str) -> None:
        """Forget ``rejected`` unless a newer token already replaced it (avoids refetch stampedes)."""
        if self._token == rejected:
            self._token = None

    async def _refresh(self) -> str:
        try:
            self.fetches += 1
            token, expire = await self._fetch()
            self._token = token
            self._renew_at = self._clock.monotonic() + max(0.0, expire - self._renew_margin)
            return token
        finally:
            self._inflight = None


class FeishuClient:
    """The Open API calls the service makes, on one pooled ``aiohttp.ClientSession``."""

    def __init__(
        self,
        settings: FeishuSettings,
        *,
        clock: Clock | None = None,
        renew_margin: float = DEFAULT_RENEW_MARGIN_SECONDS,
        pool_limit: int = DEFAULT_POOL_LIMIT,
        retry: FeishuRetryPolicy | None = None,
        rng: random.Random | None = None,
        instance_id: str | None = None,
        write_timeout: float | None = None,
        observer: WriteObserver | None = None,
    ) -> None:
        self._settings = settings
        self._observer = observer  # counts each write (and traces it when tracing is on)
        # Cluster mode bounds a card write harder: a taker waits this long before its own first write,
        # so a write from an instance that lost the card cannot land after the taker's.
        self._write_timeout = (
            aiohttp.ClientTimeout(total=min(write_timeout, settings.timeout_seconds))
            if write_timeout
            else None
        )
        sends_instance = instance_id is not None and not is_feishu_host(settings.base_url)
        self._instance_headers = {INSTANCE_HEADER: instance_id} if instance_id and sends_instance else {}
        self._base_url = settings.base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_seconds)
        self._pool_limit = pool_limit
        self._session: aiohttp.ClientSession | None = None
        self._clock = clock or SystemClock()
        self._retry = retry or FeishuRetryPolicy()
        self._rng = rng or random.Random()
        self.tokens = TokenCache(self._fetch_token, self._clock, renew_margin)

    @classmethod
    async def open(cls, settings: FeishuSettings, **kwargs: Any) -> FeishuClient:
        """Create the client and its session (call ``close`` when done, or use ``async with``)."""
        client = cls(settings, **kwargs)
        client._start()
        return client

    def _start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_limit, limit_per_host=self._pool_limit)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def close(self) -> None:
        """Close the shared session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        self._start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- public calls -------------------------------------------------------------------------

    async def send_card(
        self, receive_id: str, receive_id_type: str, card: Mapping[str, Any], uuid: str
    ) -> str:
        """Send an interactive card; returns its message_id. Retried with the same ``uuid`` (Feishu dedupes
        it for 1 h), so a retry after a lost answer returns the first message, never a second one."""
        body = {
            "receive_id": receive_id,
            "msg_type": "interactive",
            "content": _card_text(card),
            "uuid": uuid,
        }
        params = {"receive_id_type": receive_id_type}
        data = await self._retrying(
            "send", lambda: self._call("send", MESSAGES_PATH, params=params, body=body)
        )
        return _field(data, "message_id")

    async def reply_card(
        self, message_id: str, card: Mapping[str, Any], uuid: str, in_thread: bool = False
    ) -> str:
        """Reply to ``message_id`` with a card (optionally in its thread); returns the new message_id."""
        body = {
            "msg_type": "interactive",
            "content": _card_text(card),
            "uuid": uuid,
            "reply_in_thread": in_thread,
        }
        path = f"{MESSAGES_PATH}/{_segment(message_id)}/reply"
        data = await self._retrying("reply", lambda: self._call("reply", path, body=body))
        return _field(data, "message_id")

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None:
        """Replace the card of a message this app sent."""
        path = f"{MESSAGES_PATH}/{_segment(message_id)}"
        body = {"content": _card_text(card)}
        await self._call("patch", path, key=message_id, body=body, timeout=self._write_timeout)

    async def create_card_entity(self, card: Mapping[str, Any]) -> str:
        """Create a CardKit card entity from card JSON 2.0; returns its card_id (sent later by reference).
        Not retried here: a failed create leaves nothing behind, the caller decides (PATCH fallback)."""
        body = {"type": "card_json", "data": _card_text(card)}
        # It goes into URL paths later: an answer that is not an id is refused here, like any bad answer.
        return _segment(_field(await self._call("card_create", CARDS_PATH, body=body), "card_id"))

    async def update_card_entity(
        self, card_id: str, card: Mapping[str, Any], sequence: int, uuid: str
    ) -> None:
        """Replace the whole card of an entity (``sequence`` strictly rising per card)."""
        body = {"card": {"type": "card_json", "data": _card_text(card)}, "sequence": sequence, "uuid": uuid}
        path = f"{CARDS_PATH}/{_segment(card_id)}"
        await self._call("card_update", path, key=card_id, body=body, timeout=self._write_timeout)

    async def set_card_streaming(self, card_id: str, streaming: bool, sequence: int, uuid: str) -> None:
        """Switch an entity's streaming mode; switching it on (again) restarts Feishu's 10-minute window."""
        settings = json.dumps({"config": {"streaming_mode": streaming}}, separators=(",", ":"))
        body = {"settings": settings, "sequence": sequence, "uuid": uuid}
        path = f"{CARDS_PATH}/{_segment(card_id)}/settings"
        await self._call("card_settings", path, key=card_id, body=body, timeout=self._write_timeout)

    async def stream_card_text(
        self, card_id: str, element_id: str, content: str, sequence: int, uuid: str
    ) -> None:
        """Set one text element's full content; a text that extends the old one is typed out."""
        body = {"content": content, "sequence": sequence, "uuid": uuid}
        path = f"{CARDS_PATH}/{_segment(card_id)}/elements/{_segment(element_id)}/content"
        await self._call("card_content", path, key=card_id, body=body, timeout=self._write_timeout)

    async def upload_image(self, data: bytes) -> str:
        """Upload image bytes for use in cards; returns the image_key."""

        def form() -> aiohttp.FormData:
            payload = aiohttp.FormData()
            payload.add_field("image_type", "message")
            # A file object, not raw bytes: aiohttp streams it (raw bytes over 1 MB warn that they block
            # the loop). BytesIO over bytes shares the buffer, so no copy of the body is made.
            payload.add_field(
                "image", io.BytesIO(data), filename="image", content_type="application/octet-stream"
            )
            return payload

        result = await self._retrying("image upload", lambda: self._call("image", IMAGES_PATH, form=form))
        return _field(result, "image_key")

    async def token_ok(self) -> bool:
        """Whether a tenant token can be had right now (for /readyz)."""
        try:
            await self.tokens.get()
        except FeishuProgressError as exc:
            log.warning("tenant token unavailable: %s", type(exc).__name__, extra={"code": _code_of(exc)})
            return False
        return True

    # --- plumbing -------------------------------------------------------------------------------

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Json]]) -> Json:
        return await with_retries(call, what=what, clock=self._clock, policy=self._retry, rng=self._rng)

    async def _call(
        self,
        api: str,
        path: str,
        *,
        key: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Json | None = None,
        form: Callable[[], aiohttp.FormData] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> Json:
        """One write of ``api`` (WRITE_ROUTES) to ``path``; ``key``: the message or card it writes."""
        token = await self.tokens.get()
        request = functools.partial(
            self._observed, api, key, path, params=params, body=body, form=form, timeout=timeout
        )
        try:
            return await request(token)
        except FeishuAPIError as exc:
            if exc.code not in TOKEN_CODES:
                raise
            log.info("token rejected, refreshing once", extra={"code": exc.code, "log_id": exc.log_id})
            self.tokens.invalidate(token)
            return await request(await self.tokens.get())

    async def _observed(self, api: str, key: str | None, path: str, token: str, **request: Any) -> Json:
        """The one place a write is observed (observe.py): counted, and traced when tracing is on."""
        method, route = WRITE_ROUTES[api]
        if self._observer is None:
            return await self._request(method, path, token, **request)
        with self._observer.write(api, method, route, key) as write:
            return await self._request(method, path, token, answered=write.answered, **request)

    async def _request(
        self,
        method: str,
        path: str,
        token: str | None,
        *,
        params: Mapping[str, str] | None = None,
        body: Json | None = None,
        form: Callable[[], aiohttp.FormData] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        answered: Callable[[int, str], None] | None = None,
    ) -> Json:
        session = self._require_session()
        headers = {**self._instance_headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        url = self._base_url + path
        try:
            async with session.request(
                method,
                url,
                params=params,
                json=body,
                data=form() if form else None,
                headers=headers,
                timeout=timeout or self._timeout,
            ) as response:
                raw = await response.read()
                if answered is not None:
                    answered(response.status, response.headers.get("x-tt-logid", ""))
                return _unwrap(response, raw)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise FeishuTransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def _fetch_token(self) -> tuple[str, float]:
        secret = self._settings.app_secret
        body = {
            "app_id": self._settings.app_id or "",
            "app_secret": secret.get_secret_value() if secret else "",
        }
        data = await self._request("POST", TOKEN_PATH, None, body=body)
        return _field(data, "tenant_access_token"), float(data.get("expire", 7200))

    def _require_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("FeishuClient is not open: use `await FeishuClient.open(...)` or `async with`")
        return self._session


def _segment(value: str) -> str:
    """An id placed in a URL path. Ids come from outside: ``..`` or ``/`` must never reach another API."""
    if not _PATH_ID.fullmatch(value):
        raise FeishuAPIError(-1, f"refusing to put {value[:40]!r} into a URL: not a Feishu id")
    return value


def _card_text(card: Mapping[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False, separators=(",", ":"))


def _unwrap(response: aiohttp.ClientResponse, raw: bytes) -> Json:
    """The ``data`` of a successful answer (or the token fields); raise FeishuAPIError otherwise."""
    payload = _parse(raw)
    code = payload.get("code")
    ok_status = 200 <= response.status < 300
    if ok_status and code == 0:
        data = payload.get("data")
        return data if isinstance(data, dict) else payload
    error = payload.get("error")
    log_id = response.headers.get("x-tt-logid") or (
        error.get("log_id", "") if isinstance(error, dict) else ""
    )
    exc = FeishuAPIError(
        code if isinstance(code, int) and code != 0 else response.status,
        str(payload.get("msg") or response.reason or "unknown error"),
        http_status=response.status,
        log_id=str(log_id),
        retry_after=_retry_after(response.headers.get("x-ogw-ratelimit-reset")),
    )
    raise exc  # logged once, by whoever decides what the failure means (sink, retry, creation)


def _field(data: Json, key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        # A success without the field we need is still a Feishu-side failure, not a KeyError.
        raise FeishuAPIError(-1, f"answer has no {key}")
    return value


def _parse(raw: bytes) -> Json:
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}  # gateways answer 5xx with HTML; the status carries the meaning
    return value if isinstance(value, dict) else {}


def _retry_after(header: str | None) -> float | None:
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        return None


def _code_of(exc: BaseException) -> int | None:
    return exc.code if isinstance(exc, FeishuAPIError) else None
