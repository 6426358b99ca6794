"""The transport-free click pipeline: dedupe → handler under the 2.5 s deadline → Feishu's reply body."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from feishu_progress.background import BackgroundTasks
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent, MemoryDeduper, event_from_payload
from feishu_progress.feishu.pipeline import REPLY_DEADLINE_SECONDS, CallbackPipeline
from feishu_progress.i18n import Msg, translate
from tests.fakes import FakeClock
from tests.test_callback_support import RecordingHandler, card_action_payload

LOCALES = ("zh_cn", "en_us")
ERROR_TEXT = translate(Msg("card.toast.error"), "zh_cn")
DUPLICATE_TEXT = translate(Msg("card.toast.duplicate"), "zh_cn")


def _event(event_id: str = "ev-1", callback_token: str = "c-1") -> CardActionEvent:
    return event_from_payload(card_action_payload(event_id, callback_token))


def _pipeline(
    handler: Any, clock: FakeClock, background: BackgroundTasks, deduper: Any = None
) -> CallbackPipeline:
    deduper = deduper or MemoryDeduper(ttl_seconds=60, now=clock.monotonic)
    return CallbackPipeline(handler, deduper, LOCALES, background, clock=clock)


async def test_a_click_gets_the_handlers_toast_and_card() -> None:
    handler = RecordingHandler(text="已取消", card={"schema": "2.0"})
    body = await _pipeline(handler, FakeClock(), BackgroundTasks()).answer(_event())
    assert body == {
        "toast": {"type": "success", "content": "已取消", "i18n": {"zh_cn": "已取消", "en_us": "已取消"}},
        "card": {"type": "raw", "data": {"schema": "2.0"}},
    }
    assert [event.event_id for event in handler.events] == ["ev-1"]


async def test_a_redelivered_click_by_event_id_or_callback_token_runs_no_second_action() -> None:
    handler = RecordingHandler()
    pipeline = _pipeline(handler, FakeClock(), BackgroundTasks())
    await pipeline.answer(_event("ev-1", "c-1"))
    same_event = await pipeline.answer(_event("ev-1", "c-2"))
    same_click = await pipeline.answer(_event("ev-2", "c-1"))
    for body in (same_event, same_click):
        assert body["toast"]["type"] == "info"
        assert body["toast"]["content"] == DUPLICATE_TEXT
        assert "card" not in body
    assert len(handler.events) == 1


async def test_a_handler_over_the_deadline_gets_an_error_toast_and_keeps_running_in_the_holder() -> None:
    clock, background, gate = FakeClock(), BackgroundTasks(), asyncio.Event()
    handler = RecordingHandler(gate=gate)
    answer = asyncio.create_task(_pipeline(handler, clock, background).answer(_event()))
    await clock.advance(REPLY_DEADLINE_SECONDS - 0.01)
    assert not answer.done()  # still inside the deadline
    await clock.advance(0.01)
    assert (await answer)["toast"] == {
        "type": "error",
        "content": ERROR_TEXT,
        "i18n": {locale: translate(Msg("card.toast.error"), locale) for locale in LOCALES},
    }
    assert len(background) == 1  # the late handler is the service's, not cancelled, not forgotten
    gate.set()
    assert await background.drain(timeout=1.0) == 0  # shutdown drains it to the end
    assert handler.finished == 1


async def test_a_late_handler_is_cancelled_only_when_shutdown_gives_up_on_it() -> None:
    clock, background = FakeClock(), BackgroundTasks()
    handler = RecordingHandler(gate=asyncio.Event())  # never opens
    answer = asyncio.create_task(_pipeline(handler, clock, background).answer(_event()))
    await clock.advance(REPLY_DEADLINE_SECONDS)
    assert (await answer)["toast"]["type"] == "error"
    assert await background.drain(timeout=0.01) == 1
    assert handler.finished == 0


async def test_a_failing_handler_is_an_error_toast_logged_once_with_its_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    background = BackgroundTasks()
    body = await _pipeline(RecordingHandler(error=RuntimeError("boom")), FakeClock(), background).answer(
        _event("ev-boom")
    )
    await FakeClock().settle()
    assert body["toast"]["type"] == "error"
    failures = [r for r in caplog.records if r.exc_info and "boom" in str(r.exc_info[1])]
    assert len(failures) == 1  # the holder does not log it a second time
    assert "ev-boom" in failures[0].getMessage()
    assert len(background) == 0


async def test_a_failing_deduper_is_an_error_toast_and_no_action() -> None:
    class BrokenDeduper:
        async def first_seen(self, key: str) -> bool:
            raise ConnectionError("redis down")

    handler = RecordingHandler()
    body = await _pipeline(handler, FakeClock(), BackgroundTasks(), BrokenDeduper()).answer(_event())
    assert body["toast"]["type"] == "error"
    assert handler.events == []


async def test_a_reply_that_cannot_be_rendered_becomes_the_error_toast() -> None:
    class Unrenderable:
        async def handle(self, event: CardActionEvent) -> CallbackReply:
            not_a_card: Any = 42  # a handler bug: dict(42) fails while rendering
            return CallbackReply("success", "ok", card=not_a_card)

    body = await _pipeline(Unrenderable(), FakeClock(), BackgroundTasks()).answer(_event())
    assert body["toast"]["type"] == "error"
    assert body["toast"]["content"] == ERROR_TEXT
