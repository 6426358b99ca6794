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
from feishu_progress.web.http import HttpError, json_error, read_body

CALLBACK_PATH = "/feishu/callback"
DUPLICATE_TOAST = Msg("card.toast.duplicate")
ERROR_TOAST = Msg("card.toast.error")

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
            return json_error(rejected.status, "callback_rejected", rejected.reason)
        except HttpError as refused:  # the body itself: type, size, time
            log.info("feishu callback refused: %s %s", refused.status, refused.code)
            return json_error(refused.status, refused.code, refused.message)
        finally:
            if self._observe is not None:
                self._observe(self._clock.monotonic() - started)

    async def _respond(self, request: web.Request) -> web.Response:
        raw_body = await read_body(
            request,
            limit=self._settings.callback.max_body_bytes,
            timeout=self._settings.callback.body_timeout_seconds,
        )
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


def callback_routes(
    handler: ActionHandler,
    deduper: CallbackDeduper,
    settings: Settings,
    clock: Clock,
    observe: Observe | None = None,
) -> list[web.RouteDef]:
    """The ``POST /feishu/callback`` route; ``observe(seconds)`` receives each request's latency."""
    endpoint = CallbackEndpoint(handler, deduper, settings, clock, observe=observe)
    return [web.post(CALLBACK_PATH, endpoint.handle)]
