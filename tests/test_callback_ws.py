"""The long-connection bridge: P2CardActionTrigger → CardActionEvent, and the thread → loop hand-off."""

from __future__ import annotations

import asyncio
import json
import threading

import lark_oapi as lark  # ~5 s: imported once for this module
import pytest
from lark_oapi.event.callback.model.p2_card_action_trigger import (
    P2CardActionTrigger,
    P2CardActionTriggerResponse,
)

from feishu_progress.background import BackgroundTasks
from feishu_progress.errors import ConfigError
from feishu_progress.feishu.callback import CardActionEvent, MemoryDeduper
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.ws import (
    THREAD_NAME,
    ConnectionState,
    WsCallbackBridge,
    card_action_event,
    start_long_connection,
)
from tests.fakes import FakeClock
from tests.test_callback_support import RecordingHandler, card_action_payload, make_settings

LOCALES = ("zh_cn", "en_us")


def _trigger(
    event_id: str = "ev-1", callback_token: str = "c-1", without_user_id: bool = False
) -> P2CardActionTrigger:
    payload = card_action_payload(event_id, callback_token)
    if without_user_id:  # what the long connection reportedly delivers
        del payload["event"]["operator"]["user_id"]
    return lark.JSON.unmarshal(json.dumps(payload), P2CardActionTrigger)


def _bridge(
    handler: RecordingHandler, reply_timeout: float = 2.5, observed: list[float] | None = None
) -> WsCallbackBridge:
    deduper = MemoryDeduper(ttl_seconds=60, now=FakeClock().monotonic)
    pipeline = CallbackPipeline(handler, deduper, LOCALES, BackgroundTasks(), reply_timeout=reply_timeout)
    observe = observed.append if observed is not None else None
    return WsCallbackBridge(pipeline, asyncio.get_running_loop(), observe=observe)


def _as_dict(response: P2CardActionTriggerResponse) -> object:
    return json.loads(lark.JSON.marshal(response) or "null")


def test_sdk_trigger_converts_to_the_webhook_event() -> None:
    event = card_action_event(_trigger(without_user_id=True))
    assert isinstance(event, CardActionEvent)
    assert (event.event_id, event.token, event.open_id, event.user_id, event.message_id, event.chat_id) == (
        "ev-1",
        "c-1",
        "ou_1",
        None,
        "om_1",
        "oc_1",
    )
    assert event.value == {"v": 1, "action": "cancel", "session_id": 42}
    assert event.form_value == {"q1": "yes", "q2": ["a", "b"]}


async def test_bridge_runs_the_handler_on_the_service_loop_from_another_thread() -> None:
    handler = RecordingHandler(text="ok", card={"schema": "2.0"})
    observed: list[float] = []
    bridge = _bridge(handler, observed=observed)
    response = await asyncio.to_thread(bridge.on_card_action, _trigger())
    assert isinstance(response, P2CardActionTriggerResponse)
    assert _as_dict(response) == {
        "toast": {"type": "success", "content": "ok", "i18n": {"zh_cn": "ok", "en_us": "ok"}},
        "card": {"type": "raw", "data": {"schema": "2.0"}},
    }
    assert [event.event_id for event in handler.events] == ["ev-1"]
    assert len(observed) == 1  # the latency metric sees long-connection clicks too


async def test_bridge_dedupes_like_the_webhook() -> None:
    handler = RecordingHandler()
    bridge = _bridge(handler)
    await asyncio.to_thread(bridge.on_card_action, _trigger("ev-1", "c-1"))
    again = await asyncio.to_thread(bridge.on_card_action, _trigger("ev-2", "c-1"))
    assert _as_dict(again)["toast"]["type"] == "info"  # type: ignore[index]
    assert len(handler.events) == 1


async def test_bridge_answers_an_error_toast_when_the_handler_is_too_slow() -> None:
    gate = asyncio.Event()
    handler = RecordingHandler(gate=gate)
    bridge = _bridge(handler, reply_timeout=0.01)
    body = await asyncio.to_thread(bridge.respond, card_action_payload())
    assert body["toast"]["type"] == "error"
    gate.set()  # not cancelled: the late handler still completes on the loop
    await FakeClock().settle()
    assert handler.finished == 1


async def test_bridge_answers_an_error_toast_when_the_handler_raises() -> None:
    bridge = _bridge(RecordingHandler(error=RuntimeError("boom")))
    body = await asyncio.to_thread(bridge.respond, card_action_payload())
    assert body["toast"]["type"] == "error"


async def test_malformed_trigger_gets_an_error_toast_and_no_action() -> None:
    handler = RecordingHandler()
    body = await asyncio.to_thread(_bridge(handler).respond, {"schema": "2.0", "header": {}})
    assert body["toast"]["type"] == "error"
    assert handler.events == []


async def test_receiver_needs_app_credentials() -> None:
    bridge = _bridge(RecordingHandler())
    settings = make_settings()
    with pytest.raises(ConfigError):
        start_long_connection(None, None, settings.feishu.base_url, bridge)
    assert not any(thread.name == THREAD_NAME for thread in threading.enumerate())


async def test_a_closed_service_loop_gets_an_error_toast_not_an_exception() -> None:
    other_loop = asyncio.new_event_loop()
    other_loop.close()
    pipeline = CallbackPipeline(RecordingHandler(), MemoryDeduper(60), LOCALES, BackgroundTasks())
    bridge = WsCallbackBridge(pipeline, other_loop)
    body = await asyncio.to_thread(bridge.respond, card_action_payload())
    assert body["toast"]["type"] == "error"


def test_connection_state_says_never_connected_down_or_silent() -> None:
    now = [0.0]
    state = ConnectionState(lambda: now[0])
    assert state.problem() == "long connection not established yet"
    state.connected(ping_interval=10)
    now[0] = 30.0  # three ping intervals without a frame is still fine
    assert state.problem() is None
    now[0] = 30.5
    assert state.problem() == "no frame from the gateway for 30 s (pings every 10 s)"
    state.frame_received(ping_interval=10)  # e.g. the pong
    assert state.problem() is None
    state.disconnected()
    now[0] = 34.5
    assert state.problem() == "long connection down for 4 s (reconnecting)"
    state.connected(ping_interval=10)
    assert state.problem() is None
