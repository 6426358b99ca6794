"""Long-connection receiver (``FP_FEISHU__MODE=ws``): card callbacks over lark-oapi's ``ws.Client``.

The SDK's client runs in its own daemon thread with its own event loop; each card action is converted
with the same ``event_from_payload`` as the webhook, deduplicated the same way, and handed to the
service's loop with ``asyncio.run_coroutine_threadsafe``. The reply must come back within 2.5 s
(Feishu's limit is 3 s); a late handler keeps running, but the user gets an error toast.

Over the long connection Feishu itself is the peer: there is no signature, token or encryption to
check, and ``operator.user_id`` may be absent.

Caveats of lark-oapi's ``ws.Client`` (reference/lark-oapi.md §5, measured on 1.7.5):

* ``import lark_oapi`` costs ~4-5 s and ~170 MB, so it happens lazily, inside the ws thread only.
* ``lark_oapi.ws.client`` binds a module-level event loop at import time (whatever loop is current,
  possibly the service's). We give the thread a fresh loop and overwrite that module global with it
  before building the client, otherwise ``start()`` fails with "This event loop is already running".
* ``Client.start()`` blocks forever and there is no ``stop()``: the thread is a daemon and dies with
  the process. A crash in ``start()`` is logged and ends the thread; ``thread.is_alive()`` says so.
* Frames of type ``CARD`` are dropped by the SDK (``_handle_data_frame`` returns early; issue #126,
  users then see error 200340). ``card.action.trigger`` is reported to arrive as ``EVENT`` frames,
  which are handled, but this is unconfirmed: test on a real tenant before relying on ws mode.
* The connection can go silently dead and the reconnect POST has no timeout (#144, #169); the webhook
  mode is the dependable one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from feishu_progress.config import Settings
from feishu_progress.errors import CallbackRejected, ConfigError
from feishu_progress.feishu.callback import (
    ActionHandler,
    CallbackDeduper,
    CallbackReply,
    CardActionEvent,
    event_from_payload,
    is_duplicate,
    render_reply,
)
from feishu_progress.i18n import Msg

DUPLICATE_TOAST = Msg("card.toast.duplicate")
ERROR_TOAST = Msg("card.toast.error")

log = logging.getLogger(__name__)


def trigger_payload(trigger: Any) -> dict[str, Any]:
    """The JSON body behind a lark-oapi ``P2CardActionTrigger`` (its attributes, nulls dropped)."""
    from lark_oapi.core.json import JSON

    payload = json.loads(JSON.marshal(trigger) or "null")
    if not isinstance(payload, dict):
        raise CallbackRejected(400, "card action trigger is not an object")
    return payload


def card_action_event(trigger: Any) -> CardActionEvent:
    """Convert a lark-oapi ``P2CardActionTrigger`` into the same event the webhook produces."""
    return event_from_payload(trigger_payload(trigger))


class WsCallbackBridge:
    """Called on the ws thread; runs dedupe and the action handler on the service's event loop."""

    def __init__(
        self,
        handler: ActionHandler,
        deduper: CallbackDeduper,
        loop: asyncio.AbstractEventLoop,
        locales: tuple[str, ...],
        reply_timeout: float = 2.5,
    ) -> None:
        self._handler = handler
        self._deduper = deduper
        self._loop = loop
        self._locales = locales
        self._reply_timeout = reply_timeout

    def on_card_action(self, trigger: Any) -> Any:
        """The function registered with ``register_p2_card_action_trigger``; returns the SDK response."""
        from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse

        try:
            payload = trigger_payload(trigger)
        except CallbackRejected:
            payload = {}  # respond() rejects it with an error toast and a log line
        return P2CardActionTriggerResponse(self.respond(payload))

    def respond(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Feishu's response body for one decrypted ``card.action.trigger`` payload (blocks this thread)."""
        try:
            event = event_from_payload(payload)
        except CallbackRejected as rejected:
            log.warning("ws card action rejected: %s", rejected.reason)
            return render_reply(CallbackReply("error", ERROR_TOAST), self._locales)
        return render_reply(self._reply_from_loop(event), self._locales)

    def _reply_from_loop(self, event: CardActionEvent) -> CallbackReply:
        future = asyncio.run_coroutine_threadsafe(self._dedupe_and_handle(event), self._loop)
        try:
            return future.result(timeout=self._reply_timeout)
        except concurrent.futures.TimeoutError:
            # Not cancelled: a half-applied action is worse than a late one.
            log.error("card action handler exceeded %.1f s for %s", self._reply_timeout, event.event_id)
            future.add_done_callback(_log_late_failure)
        except Exception:
            log.exception("card action handler failed for %s", event.event_id)
        return CallbackReply("error", ERROR_TOAST)

    async def _dedupe_and_handle(self, event: CardActionEvent) -> CallbackReply:
        if await is_duplicate(self._deduper, event):
            log.info("ws card action %s is a duplicate: no action", event.event_id)
            return CallbackReply("info", DUPLICATE_TOAST)
        return await self._handler.handle(event)


def _log_late_failure(future: concurrent.futures.Future[CallbackReply]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("late card action handler failed", exc_info=future.exception())


def start_ws_receiver(settings: Settings, bridge: WsCallbackBridge) -> threading.Thread:
    """Start lark-oapi's long connection in a daemon thread (it never returns; see the caveats above)."""
    app_id = settings.feishu.app_id
    secret = settings.feishu.app_secret
    if not app_id or secret is None:
        raise ConfigError("FP_FEISHU__MODE=ws needs FP_FEISHU__APP_ID and FP_FEISHU__APP_SECRET")
    thread = threading.Thread(
        target=_run_client,
        args=(app_id, secret.get_secret_value(), settings.feishu.base_url, bridge),
        name="feishu-ws",
        daemon=True,
    )
    thread.start()
    return thread


def _run_client(app_id: str, app_secret: str, domain: str, bridge: WsCallbackBridge) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        import lark_oapi as lark
        import lark_oapi.ws.client as sdk_ws_client

        sdk_ws_client.loop = loop  # see the module docstring: the SDK's import-time loop may be ours
        dispatcher = (
            lark.EventDispatcherHandler.builder("", "")
            .register_p2_card_action_trigger(bridge.on_card_action)
            .build()
        )
        lark.ws.Client(app_id, app_secret, event_handler=dispatcher, domain=domain).start()
    except Exception:
        log.exception("feishu long connection stopped")
    finally:
        loop.close()
