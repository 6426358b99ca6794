"""``POST /feishu/callback``: Feishu card callbacks and the URL check, over aiohttp.

The handler reads the raw body under a hard cap, lets ``feishu.callback.parse_callback`` verify and
parse it, drops duplicates, and turns the ``ActionHandler``'s reply into Feishu's response. Bad input
gets a 4xx with a short JSON reason; a failing action handler gets a 200 with an error toast (Feishu
shows it to the user) and a logged traceback. Nothing answers 500 for anything a client sends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from feishu_progress.config import Settings
from feishu_progress.errors import CallbackRejected
from feishu_progress.feishu.callback import (
    ActionHandler,
    CallbackDeduper,
    CallbackReply,
    CardActionEvent,
    UrlVerification,
    is_duplicate,
    parse_callback,
    render_reply,
    render_toast,
)
from feishu_progress.i18n import Msg
from feishu_progress.ports import Clock

CALLBACK_PATH = "/feishu/callback"
DUPLICATE_TOAST = Msg("card.toast.duplicate")
ERROR_TOAST = Msg("card.toast.error")
_READ_CHUNK = 64 * 1024

log = logging.getLogger(__name__)

Observe = Callable[[float], None]


class CallbackEndpoint:
    """The aiohttp handler for one configured service (settings, action handler, deduper, clock)."""

    def __init__(
        self,
        handler: ActionHandler,
        deduper: CallbackDeduper,
        settings: Settings,
        clock: Clock,
        *,
        observe: Observe | None = None,
        reply_timeout: float = 2.5,
    ) -> None:
        self._handler = handler
        self._deduper = deduper
        self._settings = settings
        self._clock = clock
        self._observe = observe
        self._reply_timeout = reply_timeout
        self._background: set[asyncio.Task[CallbackReply]] = set()

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one callback request; records its latency with ``observe``."""
        started = self._clock.monotonic()
        try:
            return await self._respond(request)
        except CallbackRejected as rejected:
            log.info("feishu callback rejected: %s %s", rejected.status, rejected.reason)
            return web.json_response({"msg": rejected.reason}, status=rejected.status)
        finally:
            if self._observe is not None:
                self._observe(self._clock.monotonic() - started)

    async def _respond(self, request: web.Request) -> web.Response:
        raw_body = await read_capped_json_body(request, self._settings.callback.max_body_bytes)
        parsed = self._parse(raw_body, request)
        if isinstance(parsed, UrlVerification):
            return web.json_response({"challenge": parsed.challenge})
        try:
            duplicate = await is_duplicate(self._deduper, parsed)
        except Exception:
            log.exception("callback deduper failed for %s", parsed.event_id)
            return self._toast_response(CallbackReply("error", ERROR_TOAST))
        if duplicate:
            log.info("feishu callback %s is a duplicate: no action", parsed.event_id)
            return self._toast_response(CallbackReply("info", DUPLICATE_TOAST))
        return self._toast_response(await self._handle(parsed))

    def _parse(self, raw_body: bytes, request: web.Request) -> UrlVerification | CardActionEvent:
        try:
            return parse_callback(raw_body, request.headers, self._settings, now=self._clock.wall())
        except CallbackRejected:
            raise
        except Exception as exc:
            # A parser bug must still not turn client input into a 500; the traceback names no payload.
            log.exception("unexpected error while parsing a feishu callback")
            raise CallbackRejected(400, "malformed callback") from exc

    async def _handle(self, event: CardActionEvent) -> CallbackReply:
        # The handler runs as its own task and is never cancelled on timeout: a half-applied action
        # is worse than a late one. Feishu gives up after 3 s, so we answer with an error toast first.
        task = asyncio.create_task(self._handler.handle(event))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._reply_timeout)
        except TimeoutError:
            log.error("card action handler exceeded %.1f s for %s", self._reply_timeout, event.event_id)
            self._background.add(task)
            task.add_done_callback(self._forget_late_task)
        except Exception:
            log.exception("card action handler failed for %s", event.event_id)
        return CallbackReply("error", ERROR_TOAST)

    def _forget_late_task(self, task: asyncio.Task[CallbackReply]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("late card action handler failed", exc_info=task.exception())

    def _toast_response(self, reply: CallbackReply) -> web.Response:
        try:
            body: dict[str, Any] = render_reply(reply, self._settings.card.locales)
        except Exception:
            log.exception("card action reply could not be rendered")
            body = {"toast": render_toast("error", ERROR_TOAST, self._settings.card.locales)}
        return web.json_response(body)


async def read_capped_json_body(request: web.Request, limit: int) -> bytes:
    """The raw body; non-JSON → 415, more than ``limit`` bytes → 413 (without reading it all)."""
    if request.content_length is not None and request.content_length > limit:
        raise CallbackRejected(413, "body too large")
    if request.content_type != "application/json":
        raise CallbackRejected(415, "content type must be application/json")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise CallbackRejected(413, "body too large")
        chunks.append(chunk)
    return b"".join(chunks)


def callback_routes(
    handler: ActionHandler,
    deduper: CallbackDeduper,
    settings: Settings,
    clock: Clock,
    observe: Observe | None = None,
) -> list[web.RouteDef]:
    """The ``POST /feishu/callback`` route; ``observe(seconds)`` receives each request's latency."""
    if settings.feishu.encrypt_key is None and settings.feishu.verification_token is None:
        log.warning(
            "FP_FEISHU__ENCRYPT_KEY and FP_FEISHU__VERIFICATION_TOKEN are unset: "
            "card callbacks are accepted without authentication (sandbox only)"
        )
    endpoint = CallbackEndpoint(handler, deduper, settings, clock, observe=observe)
    return [web.post(CALLBACK_PATH, endpoint.handle)]
