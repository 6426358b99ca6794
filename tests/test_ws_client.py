"""Our long-connection client (feishu/ws.py) against the sandbox's gateway, over a real websocket.

The click pipeline here has a recording handler instead of the service; ``tests/test_ws_mode.py`` runs
the whole service. Waits are real but short: the gateway tells the client to reconnect after 1 s.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from feishu_progress.background import BackgroundTasks
from feishu_progress.config import FeishuSettings
from feishu_progress.errors import ConfigError
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent, MemoryDeduper
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.ws import SILENT_PING_INTERVALS, ConnectionState, LongConnection
from feishu_progress.feishu.ws_protocol import ClientConfig
from feishu_progress.sandbox.clicks import card_action_payload
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.sandbox.ws_gateway import FrameAnswer
from tests.fakes import FakeClock
from tests.rigs import APP_ID, APP_SECRET, eventually
from tests.test_callback_support import RecordingHandler

pytestmark = pytest.mark.ws

LOCALES = ("zh_cn", "en_us")
FAST = ClientConfig(reconnect_count=-1, reconnect_interval=1, reconnect_nonce=0, ping_interval=1)
ANSWER_SECONDS = 3.0  # Feishu's deadline for a click's answer


@pytest.fixture
def sandbox_ws_config() -> ClientConfig:
    return FAST


def _connection(
    sandbox: RunningSandbox, handler: Any, *, secret: str = APP_SECRET, reply_timeout: float = 2.5
) -> LongConnection:
    pipeline = CallbackPipeline(
        handler, MemoryDeduper(ttl_seconds=60), LOCALES, BackgroundTasks(), reply_timeout=reply_timeout
    )
    feishu = FeishuSettings(base_url=sandbox.base_url, app_id=APP_ID, app_secret=secret, mode="ws")
    return LongConnection("research", feishu, pipeline, max_payload_bytes=1 << 20)


async def _started(sandbox: RunningSandbox, connection: LongConnection) -> LongConnection:
    connection.start()
    await eventually(lambda: sandbox.gateway.connection_count == 1, 10, "the connection")
    return connection


def _click(token: str = "c-1", event_id: str | None = None) -> dict[str, Any]:
    return card_action_payload(
        open_id="ou_1",
        message_id="om_1",
        value={"v": 1, "action": "cancel", "session_id": 42},
        verification_token="",
        now=time.time(),
        click_token=token,
        event_id=event_id,
    )


async def _answer(sandbox: RunningSandbox, payload: dict[str, Any]) -> FrameAnswer:
    delivery = await sandbox.gateway.push(payload)
    return await delivery.wait(ANSWER_SECONDS)


async def test_a_click_is_answered_by_the_pipeline_and_tagged_with_the_connections_app(
    sandbox: RunningSandbox,
) -> None:
    handler = RecordingHandler(text="ok", card={"schema": "2.0"})
    connection = await _started(sandbox, _connection(sandbox, handler))
    try:
        answer = await _answer(sandbox, _click())
        assert answer.code == 200 and answer.body is not None
        assert answer.body["toast"]["content"] == "ok"
        assert answer.body["card"] == {"type": "raw", "data": {"schema": "2.0"}}
        assert [event.app for event in handler.events] == ["research"]
        again = await _answer(sandbox, _click(token="c-1"))  # the same click token: deduped
        assert again.body is not None and again.body["toast"]["type"] == "info"
        assert len(handler.events) == 1
        assert connection.problem() is None
    finally:
        assert await connection.stop(5)


class _SlowFor:
    """Answers at once, except a click with event id ``slow``, which waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        if event.event_id == "slow":
            await self.gate.wait()
        return CallbackReply("success", event.event_id)


async def test_clicks_are_answered_concurrently_and_a_slow_one_gets_an_error_toast_in_time(
    sandbox: RunningSandbox,
) -> None:
    handler = _SlowFor()
    connection = await _started(sandbox, _connection(sandbox, handler, reply_timeout=0.5))
    try:
        slow = await sandbox.gateway.push(_click("c-slow", event_id="slow"))
        fast = await _answer(sandbox, _click("c-fast", event_id="fast"))
        assert fast.body is not None and fast.body["toast"]["content"] == "fast"
        assert not slow.answer.done()  # lark-oapi answered one click after the other
        late = await slow.wait(ANSWER_SECONDS)
        assert late.body is not None and late.body["toast"]["type"] == "error"
        handler.gate.set()
    finally:
        assert await connection.stop(5)


async def test_a_failing_handler_a_foreign_event_and_a_broken_click_are_each_answered(
    sandbox: RunningSandbox,
) -> None:
    connection = await _started(sandbox, _connection(sandbox, RecordingHandler(error=RuntimeError("boom"))))
    try:
        failed = await _answer(sandbox, _click())
        assert failed.code == 200 and failed.body is not None and failed.body["toast"]["type"] == "error"
        foreign = {"schema": "2.0", "header": {"event_type": "im.message.receive_v1"}, "event": {}}
        acknowledged = await _answer(sandbox, foreign)
        assert (acknowledged.code, acknowledged.body) == (200, None)
        broken = await _answer(sandbox, {"schema": "2.0", "header": {"event_type": "card.action.trigger"}})
        assert broken.body is not None and broken.body["toast"]["type"] == "error"
    finally:
        assert await connection.stop(5)


async def test_a_click_split_into_parts_is_joined_and_answered(sandbox: RunningSandbox) -> None:
    sandbox.gateway.fragment_bytes = 64
    handler = RecordingHandler()
    connection = await _started(sandbox, _connection(sandbox, handler))
    try:
        answer = await _answer(sandbox, _click())
        assert answer.body is not None and answer.body["toast"]["type"] == "success"
        assert len(handler.events) == 1
    finally:
        assert await connection.stop(5)


async def test_a_dropped_connection_comes_back_and_a_click_pushed_meanwhile_is_answered(
    sandbox: RunningSandbox,
) -> None:
    connection = await _started(sandbox, _connection(sandbox, RecordingHandler()))
    try:
        sandbox.gateway.available = False  # discovery answers 503 while Feishu is away
        assert await sandbox.gateway.drop_all() == 1
        await eventually(lambda: "down" in (connection.problem() or ""), 5, "the client to see the drop")
        pushed = await sandbox.gateway.push(_click())
        await asyncio.sleep(1.5)  # at least one retry refused
        assert sandbox.gateway.connects == 1 and not pushed.answer.done()
        sandbox.gateway.available = True
        answer = await pushed.wait(5)  # the next retry (1 s), then the queued frame
        assert answer.body is not None and answer.body["toast"]["type"] == "success"
        assert sandbox.gateway.connects == 2 and connection.problem() is None
    finally:
        assert await connection.stop(5)


async def test_a_silent_gateway_is_left_for_a_new_connection(sandbox: RunningSandbox) -> None:
    connection = await _started(sandbox, _connection(sandbox, RecordingHandler()))
    try:
        sandbox.gateway.answer_pings = False  # connected, but nothing comes back: a dead path
        silent = SILENT_PING_INTERVALS * FAST.ping_interval
        await eventually(lambda: sandbox.gateway.connects >= 2, silent + 3, "a reconnect")
        await eventually(lambda: sandbox.gateway.connection_count == 1, 3, "the old connection to close")
    finally:
        assert await connection.stop(5)


async def test_a_refused_secret_is_reported_and_retried_not_fatal(sandbox: RunningSandbox) -> None:
    connection = _connection(sandbox, RecordingHandler(), secret="wrong-secret")
    connection.start()
    try:
        await eventually(lambda: "refused" in (connection.problem() or ""), 5, "the refusal")
        assert "10014" in (connection.problem() or "")
        assert (sandbox.gateway.discoveries, sandbox.gateway.connects) == (1, 0)
    finally:
        started = time.monotonic()
        assert await connection.stop(5)  # stops while it waits to retry
    assert time.monotonic() - started < 2
    assert connection.problem() == "long-connection receiver is not running"


async def test_stop_ends_a_client_still_waiting_for_feishu(sandbox: RunningSandbox) -> None:
    sandbox.gateway.available = False  # Feishu down at startup
    connection = _connection(sandbox, RecordingHandler())
    connection.start()
    await eventually(lambda: sandbox.gateway.discoveries >= 1, 5, "a discovery attempt")
    assert connection.problem() == "long connection not established yet"
    started = time.monotonic()
    assert await connection.stop(5)
    assert time.monotonic() - started < 2 and sandbox.gateway.connects == 0


def test_ws_mode_needs_the_apps_credentials() -> None:
    pipeline = CallbackPipeline(RecordingHandler(), MemoryDeduper(60), LOCALES, BackgroundTasks())
    with pytest.raises(ConfigError, match="app sales"):
        LongConnection("sales", FeishuSettings(mode="ws"), pipeline, max_payload_bytes=1024)


async def test_connection_state_says_never_connected_refused_down_or_silent() -> None:
    clock = FakeClock(start=0.0)
    state = ConnectionState(clock)
    assert state.problem() == "long connection not established yet"
    state.refused("code 10014: app secret invalid")
    assert state.problem() == "endpoint discovery refused: code 10014: app secret invalid (retrying)"
    state.connected(ping_interval=10)
    await clock.advance(30.0)  # three ping intervals without a frame is still fine
    assert state.problem() is None
    await clock.advance(0.5)
    assert state.problem() == "no frame from the gateway for 30 s (pings every 10 s)"
    state.frame_received(ping_interval=10)  # e.g. the pong
    assert state.problem() is None
    state.disconnected()
    await clock.advance(4.0)
    assert state.problem() == "long connection down for 4 s (reconnecting)"
    state.connected(ping_interval=10)
    assert state.problem() is None
