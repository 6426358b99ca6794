"""One way to answer a card click, whatever carried it: dedupe → action handler → Feishu's reply body.

Both transports hand a parsed ``CardActionEvent`` to ``CallbackPipeline.answer``: the webhook
(``web/callbacks.py``) after verifying and decrypting the request, the long connection
(``feishu/ws.py``) after decoding a data frame. Nothing here knows about HTTP or frames.

* A click whose event id or callback token was seen before gets a neutral toast and no action.
* The action handler runs as a task of the service's background holder and is given ``reply_timeout``
  (2.5 s: Feishu gives up at 3 s). A late handler is not cancelled — a half-applied action is worse
  than a late one — the user gets an error toast now, and the holder drains it at shutdown.
* Any failure (deduper, handler, rendering) becomes an error toast and a logged traceback: Feishu
  shows the toast, and nothing a click sends can make a transport answer 5xx.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

from feishu_progress.feishu.callback import (
    ActionHandler,
    CallbackReply,
    CardActionEvent,
    is_duplicate,
    render_reply,
    render_toast,
)
from feishu_progress.i18n import Msg
from feishu_progress.ports import Clock, Deduper, SystemClock

REPLY_DEADLINE_SECONDS = 2.5  # Feishu's limit is 3 s; the rest is transport and Feishu's own hop
ERROR_TOAST = Msg("card.toast.error")
DUPLICATE_REPLY = CallbackReply("info", Msg("card.toast.duplicate"))
ERROR_REPLY = CallbackReply("error", ERROR_TOAST)

T = TypeVar("T")
log = logging.getLogger(__name__)


class TaskSpawner(Protocol):
    """The service's tracked background tasks (``background.BackgroundTasks``)."""

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]: ...


class CallbackPipeline:
    """Dedupe, the action handler under a deadline, and the rendered reply; runs on the service loop."""

    def __init__(
        self,
        handler: ActionHandler,
        deduper: Deduper,
        locales: tuple[str, ...],
        background: TaskSpawner,
        *,
        reply_timeout: float = REPLY_DEADLINE_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        self._handler = handler
        self._deduper = deduper
        self._locales = locales
        self._background = background
        self.reply_timeout = reply_timeout
        self._clock = clock or SystemClock()

    async def answer(self, event: CardActionEvent) -> dict[str, Any]:
        """Feishu's response body (toast and maybe a card) for one verified click; never raises."""
        return self.render(await self._reply(event))

    def render(self, reply: CallbackReply) -> dict[str, Any]:
        """Feishu's body for ``reply``; a reply that cannot be rendered becomes the error toast."""
        try:
            return render_reply(reply, self._locales)
        except Exception:
            log.exception("card action reply could not be rendered")
            return {"toast": render_toast("error", ERROR_TOAST, self._locales)}

    def error_body(self) -> dict[str, Any]:
        """The body that tells the user their click failed (for failures outside the pipeline)."""
        return self.render(ERROR_REPLY)

    async def _reply(self, event: CardActionEvent) -> CallbackReply:
        try:
            duplicate = await is_duplicate(self._deduper, event)
        except Exception:
            log.exception("callback deduper failed for %r", event.event_id)
            return ERROR_REPLY
        if duplicate:
            log.info("card action %r is a duplicate: no action", event.event_id)
            return DUPLICATE_REPLY
        task = self._background.spawn(self._handle(event), name=f"card-action-{event.event_id[:64]}")
        # The deadline ends our wait, never the handler: asyncio.wait cancels neither task.
        timer = asyncio.ensure_future(self._clock.sleep(self.reply_timeout))
        try:
            await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        log.error("card action handler exceeded %.1f s for %r", self.reply_timeout, event.event_id)
        return ERROR_REPLY

    async def _handle(self, event: CardActionEvent) -> CallbackReply:
        # Failures are logged here, once, early or late; the holder then sees a task that succeeded.
        try:
            return await self._handler.handle(event)
        except Exception:
            log.exception("card action handler failed for %r", event.event_id)
            return ERROR_REPLY
