"""One budget table: every Open API its own budget, FP_RATE__APP_PER_* capping each, on both transports.

The end-to-end tests drive the service (create_app, SQLite) over real HTTP against a sandbox that enforces
exactly the lowered FP_RATE budget on every API, with demand far above it, and read what the sandbox
answered: not one rate-limit answer is allowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any, Literal

import pytest
from pydantic import SecretStr

from feishu_progress.config import ApiLimit, FeishuSettings, RateSettings, Settings
from feishu_progress.db.repo import TaskRepository
from feishu_progress.demo import API_TOKEN, APP_ID, APP_SECRET
from feishu_progress.feishu import FeishuClient
from feishu_progress.images import ImageUploads
from feishu_progress.ports import SystemClock
from feishu_progress.progress.admission import Admission, BudgetBusy
from feishu_progress.progress.card_stream import (
    CardStream,
    Op,
    Pacing,
    Shown,
    apis_of,
    plan,
    plan_ahead,
)
from feishu_progress.progress.rate_budget import AppBudget, BudgetTable
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from tests.fakes import rate_with_api
from tests.rigs import eventually
from tests.test_cardkit_transport import admin, answer_of, entity, service, stream_text

PACING = Pacing(panel_interval=1.5, streaming_window=540)

# An operator sharing the app's quota: 20/s and 600/min, and Feishu (the sandbox) enforcing exactly that.
CAPPED = RateSettings(app_per_second=20, app_per_minute=600)
CARDS = 24
CREATES = 20
SLACK = 1.5  # a busy shared machine answers late; the bound is 1 s here, 10 s by default


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["cardkit", "patch"])
async def test_only_fp_rate_lowered_gives_no_rate_limit_answer_on_either_transport(
    transport: Literal["cardkit", "patch"],
) -> None:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET, app_per_second=20, app_per_minute=600)
    async with service(config, transport=transport, rate=CAPPED) as first:
        runs = [first, *(first.another() for _ in range(CARDS - 1))]
        for i, run in enumerate(runs):
            await run.create_task(f"限额 {i}")
            await run.send({"type": "status", "status": "RUNNING", "round": 1})
        # Each card asks for a write every 50 ms (and a tool panel every 5th): ~20x the 20/s budget.
        texts = await asyncio.gather(*(stream_text(run, 3.0, every=0.05, tool_every=5) for run in runs))
        for run in runs:
            await run.send({"type": "finished", "status": "COMPLETED"})
        messages = [first.sandbox.state.messages[run.message_id] for run in runs]
        await eventually(lambda: all(m.card["header"]["template"] == "green" for m in messages), timeout=30)
        for message, text in zip(messages, texts, strict=True):
            assert answer_of(message.card).strip() == text.strip()
        state = first.sandbox.state
        assert state.rate_limited() == 0, dict(state.responses)
        written = state.cardkit.stats() if transport == "cardkit" else {"patch": state.requests["patch"]}
        assert sum(v for k, v in written.items() if k in {"full", "content", "patch"}) >= CARDS * 3, written


# -- the table, pure -----------------------------------------------------------------------------------


def test_each_api_has_its_own_budget_capped_by_fp_rate() -> None:
    rate = RateSettings(app_per_second=20, app_per_minute=600)
    for api in ("send", "reply", "patch", "image", "card_create", "card_update", "card_settings"):
        capped = rate.for_api(api)
        assert (capped.app_per_second, capped.app_per_minute) == (20, 600), api
    own = rate.model_copy(
        update={"api": rate.api.model_copy(update={"card_content": ApiLimit(per_second=5, per_minute=900)})}
    )
    content = own.for_api("card_content")
    assert (content.app_per_second, content.app_per_minute) == (5, 600)  # its own, then the cap
    default = RateSettings().for_api("card_content")
    assert (default.app_per_second, default.app_per_minute) == (50, 1000)  # Feishu's documented limit
    with pytest.raises(KeyError, match="no budget"):
        rate.for_api("message_interval_ms")


def test_the_budget_table_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP_RATE__APP_PER_SECOND", "20")
    monkeypatch.setenv("FP_RATE__API__CARD_CONTENT__PER_SECOND", "7")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.rate.for_api("card_content").app_per_second == 7
    assert settings.rate.for_api("card_update").app_per_second == 20
    assert settings.deprecations() == []


def test_the_deprecated_cardkit_budget_sets_the_cardkit_apis_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FP_CARDKIT__APP_PER_SECOND", "30")
    monkeypatch.setenv("FP_RATE__APP_PER_SECOND", "20")
    monkeypatch.setenv("FP_RATE__API__CARD_CONTENT__PER_SECOND", "40")  # the new name wins where given
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.rate.api.card_update.per_second == 30
    assert settings.rate.api.card_content.per_second == 40
    assert settings.rate.api.patch.per_second == 50
    assert settings.rate.for_api("card_update").app_per_second == 20  # FP_RATE still caps it
    (note,) = settings.deprecations()
    assert "FP_CARDKIT__APP_PER_SECOND" in note and "FP_RATE__API__CARD_UPDATE__PER_SECOND" in note


# -- each CardKit API its own budget (issue 27 item 2) ----------------------------------------------------


@pytest.mark.slow
async def test_text_streams_while_the_panel_budget_is_spent() -> None:
    # The card-update API may be called 3 times a minute; the element-content API has Feishu's 50/s.
    async with service(rate=rate_with_api("card_update", 1, 3)) as run:
        await run.create_task("文字不等面板")
        await run.send({"type": "status", "status": "RUNNING", "round": 1})
        started = run.sandbox.state.now()
        text = await stream_text(run, 3.0, every=0.05, tool_every=4)  # a tool panel change every 200 ms
        ended = run.sandbox.state.now()
        card = entity(run)
        steady = [s for s in card.record.streams if started + 0.5 <= s.at <= ended]
        assert len(steady) / (ended - started - 0.5) >= 4, f"{len(steady)} streamed updates"
        assert card.record.updates["full"] <= 3  # the panel budget held, and the text never waited for it
        await eventually(lambda: answer_of(card.card).strip() == text.strip(), timeout=5)
        assert run.sandbox.state.rate_limited() == 0


@pytest.mark.slow
async def test_panels_update_while_the_text_budget_is_spent() -> None:
    async with service(rate=rate_with_api("card_content", 1, 3)) as run:
        await run.create_task("面板不等文字")
        await run.send({"type": "status", "status": "RUNNING", "round": 1})
        before = entity(run).record.updates["full"]
        await stream_text(run, 4.0, every=0.05, tool_every=4)
        card = entity(run)
        assert len(card.record.streams) <= 3  # the text budget held
        assert card.record.updates["full"] - before >= 2  # panels at their 1.5 s pace all the same
        assert run.sandbox.state.rate_limited() == 0


def ahead(stream: CardStream, **marks: Any) -> list[tuple[str, ...]]:
    """The API choices of the next write, best first."""
    return [apis_of(choice) for choice in plan_ahead(stream, pacing=PACING, **marks)]


def test_a_write_names_its_apis_before_it_is_built() -> None:
    stream = CardStream("c1", fence=0, panel_version=1, text_version=1, text="a", streaming=True)
    stream.opened_at, stream.written_at = 0.0, 0.0
    marks = {"streams": True, "urgent": False}
    # Text: by its own API, or in a whole write when the text's budget is spent (the update API's room).
    assert ahead(stream, panel_version=1, text_version=2, now=1, **marks) == [
        ("card_content",),
        ("card_update",),
    ]
    assert ahead(stream, panel_version=2, text_version=1, now=2, **marks) == [("card_update",)]
    # Panels due and text owed: whole if the panel budget has room, else the text alone.
    assert ahead(stream, panel_version=2, text_version=2, now=2, **marks) == [
        ("card_update",),
        ("card_content",),
    ]
    early, _ = plan_ahead(stream, panel_version=2, text_version=2, now=1, pacing=PACING, **marks)
    assert apis_of(early) == ("card_content",) and early.owed_at == 1.5
    ending = ahead(stream, panel_version=2, text_version=2, streams=False, urgent=True, now=1)
    assert ending == [("card_settings", "card_update")]  # only a whole write shows a wait or an end
    stream.panels_due = 1.0  # a write left the panels behind (the cut moved, or a call was not budgeted)
    assert ahead(stream, panel_version=1, text_version=1, now=1, **marks) == [("card_update",)]
    assert ahead(stream, panel_version=1, text_version=1, now=0.5, **marks) == [()]  # nothing to call yet


def test_under_load_a_cards_writes_take_turns_between_the_two_apis() -> None:
    """Panels due again right after a whole write: the text goes alone first, the whole card is the
    fallback; after a text-alone write the whole card is first again. Urgent writes stay whole."""
    stream = CardStream("c1", fence=0, panel_version=1, text_version=1, text="a", streaming=True)
    stream.opened_at, stream.written_at = 0.0, 0.0
    marks = {"panel_version": 2, "text_version": 2, "streams": True, "now": 2.0}
    whole = Shown(panel_version=1, text="a", streams=True, text_version=1)
    stream.done(Op.FULL, now=0.0, shown=whole)
    assert stream.whole_last
    assert ahead(stream, urgent=False, **marks) == [("card_content",), ("card_update",)]
    assert ahead(stream, urgent=True, **marks) == [("card_update",), ("card_content",)]
    stream.done(Op.TEXT, now=0.1, shown=Shown(panel_version=2, text="ab", streams=True, text_version=2))
    assert not stream.whole_last
    assert ahead(stream, urgent=False, **{**marks, "text_version": 3}) == [
        ("card_update",),
        ("card_content",),
    ]
    stream.done(Op.FULL, now=0.2, shown=whole)
    stream.streaming = None  # streaming resumes (after a wait for the user): the whole card at once
    assert ahead(stream, urgent=False, **marks)[0] == ("card_settings", "card_update")


def test_cards_created_together_start_their_turns_on_both_apis() -> None:
    created = [CardStream.created(f"7sandbox{n:06d}", 0, text=None, now=0.0) for n in range(200)]
    first_whole = sum(stream.whole_last for stream in created)
    assert 70 <= first_whole <= 130, first_whole  # about half, by id: not every card on one API
    again = [CardStream.created(f"7sandbox{n:06d}", 0, text=None, now=5.0) for n in range(200)]
    assert [s.whole_last for s in again] == [s.whole_last for s in created]  # the id decides


def test_a_write_without_the_panel_budget_streams_the_text_and_owes_the_panels() -> None:
    stream = CardStream("c1", fence=0, panel_version=1, text="a", streaming=True, opened_at=0, written_at=0)
    chosen = plan(
        stream, panel_version=2, text="ab", streams=True, urgent=True, now=2, pacing=PACING, whole=False
    )
    assert chosen.ops == (Op.TEXT,) and chosen.owed_at == 1.5
    first = plan(
        CardStream("c1", fence=0, panel_version=1, text=None, streaming=True),
        panel_version=1,
        text="a",
        streams=True,
        urgent=False,
        now=2,
        pacing=PACING,
        whole=False,
    )
    assert first.ops == ()  # no answer element yet: it waits for a whole write
    spent_text = plan(
        stream,
        panel_version=1,
        text="abc",
        streams=True,
        urgent=False,
        now=0.1,
        pacing=PACING,
        text_alone=False,
    )
    assert spent_text.ops == (Op.FULL,) and spent_text.owed_at is None  # the text in a whole write


# -- creates never stall on the send budget (issue 27 item 4) ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["cardkit", "patch"])
async def test_a_create_waits_for_the_send_budget_at_most_its_bound_then_its_retry_gets_the_same_task(
    transport: Literal["cardkit", "patch"],
) -> None:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET, app_per_second=5, app_per_minute=300)
    rate = RateSettings(app_per_second=5, app_per_minute=300, create_wait_seconds=1.0)
    async with service(config, transport=transport, rate=rate) as run:
        url, auth = f"{run.base_url}/v1/tasks", {"Authorization": f"Bearer {API_TOKEN}"}
        body = {"receive_id": "oc_bound", "receive_id_type": "chat_id", "requester_open_id": "ou_r"}

        async def create(key: str) -> tuple[float, int, str | None, dict[str, Any]]:
            started = time.monotonic()
            async with run.http.post(url, json=body, headers={**auth, "Idempotency-Key": key}) as answer:
                payload = await answer.json()
                return time.monotonic() - started, answer.status, answer.headers.get("Retry-After"), payload

        keys = [f"bound-{transport}-{i}" for i in range(CREATES)]
        first = await asyncio.gather(*(create(key) for key in keys))
        assert max(took for took, *_ in first) <= 1.0 + SLACK, [round(t, 2) for t, *_ in first]
        busy = [(after, payload) for _, status, after, payload in first if status == 503]
        assert busy, "20 creates at once on a 5/s budget: some must be told to come back"
        for after, payload in busy:
            assert after is not None and int(after) >= 1 and payload["retry_after"] == int(after), payload
        sessions = {
            key: payload["session_id"]
            for key, (_, status, _, payload) in zip(keys, first, strict=True)
            if status == 201
        }
        for key in keys:
            while key not in sessions:
                took, status, after, payload = await create(key)
                assert took <= 1.0 + SLACK
                if status == 201:
                    sessions[key] = payload["session_id"]
                else:
                    assert status == 503 and after is not None, payload
                    await asyncio.sleep(min(int(after), 2))  # the client waits as told (capped for the test)
            again = await create(key)  # once more: the same task, not a new one
            assert (again[1], again[3]["session_id"]) == (201, sessions[key])
        assert len(set(sessions.values())) == CREATES
        cards = [m for m in run.sandbox.state.messages.values() if m.chat_id == "oc_bound"]
        assert len(cards) == CREATES  # one first card per task, however often it was asked for
        assert run.sandbox.state.rate_limited() == 0


async def test_creates_past_what_the_budget_serves_within_the_bound_are_refused_at_the_door() -> None:
    # 2/s and a 1.5 s bound: three creates in progress already fill it (3 ÷ 2/s = 1.5 s), so the fourth
    # is told to come back at once, before it writes anything, and a place freed lets the next one in.
    admission = Admission(
        BudgetTable(RateSettings(app_per_second=2, app_per_minute=120)), clock=SystemClock()
    )
    async with contextlib.AsyncExitStack() as held:
        for _ in range(3):
            await held.enter_async_context(admission.creating("send", max_wait=1.5))
        with pytest.raises(BudgetBusy) as refused:
            await held.enter_async_context(admission.creating("send", max_wait=1.5))
        assert refused.value.retry_after == 2  # the four creates' turns: 4 ÷ 2/s
        async with admission.creating("card_create", max_wait=1.5):
            pass  # another API's creates are counted apart
    async with admission.creating("send", max_wait=1.5) as deadline:
        assert deadline - SystemClock().monotonic() == pytest.approx(1.5, abs=0.1)


@pytest.mark.slow
async def test_a_create_refused_at_the_door_writes_nothing_and_its_retry_makes_the_one_task() -> None:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET, app_per_second=5, app_per_minute=300)
    rate = RateSettings(app_per_second=5, app_per_minute=300, create_wait_seconds=1.0)
    async with service(config, transport="patch", rate=rate) as run:
        url, auth = f"{run.base_url}/v1/tasks", {"Authorization": f"Bearer {API_TOKEN}"}
        body = {"receive_id": "oc_door", "receive_id_type": "chat_id", "requester_open_id": "ou_r"}
        repo = TaskRepository(admin(run).db)

        async def create(key: str) -> tuple[int, str | None, dict[str, Any]]:
            async with run.http.post(url, json=body, headers={**auth, "Idempotency-Key": key}) as answer:
                return answer.status, answer.headers.get("Retry-After"), await answer.json()

        keys = [f"door-{i}" for i in range(CREATES)]
        first = dict(zip(keys, await asyncio.gather(*(create(key) for key in keys)), strict=True))
        refused = [key for key, (status, _, _) in first.items() if status == 503]
        # 5/s within 1 s: five creates in progress fill the bound; the others were never let in.
        assert len(refused) >= CREATES - 5, [status for status, _, _ in first.values()]
        for key in refused:
            status, after, payload = first[key]
            assert "budget is busy" in payload["message"] and after is not None, payload
            assert await repo.find_by_idempotency_key(key) is None  # refused before any write
        sessions = {
            key: payload["session_id"] for key, (status, _, payload) in first.items() if status == 201
        }
        for key in refused:
            while key not in sessions:
                status, after, payload = await create(key)
                if status == 201:
                    sessions[key] = payload["session_id"]
                else:
                    await asyncio.sleep(min(int(after or 1), 2))
        assert len(set(sessions.values())) == CREATES
        cards = [m for m in run.sandbox.state.messages.values() if m.chat_id == "oc_door"]
        assert len(cards) == CREATES
        assert run.sandbox.state.rate_limited() == 0


# -- image uploads spend the image API's budget ------------------------------------------------------


async def test_image_uploads_stay_within_the_image_budget_over_real_http() -> None:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET, app_per_second=3, app_per_minute=1000)
    async with run_sandbox(config) as sandbox:
        settings = FeishuSettings(base_url=sandbox.base_url, app_id=APP_ID, app_secret=SecretStr(APP_SECRET))
        client = await FeishuClient.open(settings)
        try:
            admission = Admission(BudgetTable(RateSettings(app_per_second=3)), clock=SystemClock())
            uploads = ImageUploads(client, concurrency=8, budget=admission)
            distinct = [b"\x89PNG\r\n\x1a\n" + f"image {i}".encode() for i in range(9)]
            started = time.monotonic()
            keys = await asyncio.gather(*(uploads.upload_image(data) for data in distinct))
            took = time.monotonic() - started
        finally:
            await client.close()
        assert len(set(keys)) == 9
        assert sandbox.state.rate_limited() == 0, dict(sandbox.state.responses)
        assert took >= 1.9  # 9 uploads at 3/s: the budget spread them over (at least) two more seconds


def test_a_slot_whose_call_was_never_made_frees_at_once_a_made_one_a_window_after_it_ended() -> None:
    budget = AppBudget(RateSettings(app_per_second=1, app_per_minute=1000), now=0.0)
    assert budget.try_take(0.0, urgent=True)
    budget.release(0.1)  # the write did not need the call: nothing reached Feishu
    assert budget.next_available(0.1, urgent=True) == 0.1
    assert budget.try_take(0.1, urgent=True)
    budget.settle(0.2)  # answered at 0.2: the gateway may count it until then, so a window on from there
    assert budget.next_available(0.3, urgent=True) == pytest.approx(1.2)


def test_behind_a_gate_an_urgent_call_is_held_only_by_a_pause() -> None:
    budget = AppBudget(RateSettings(app_per_second=1, app_per_minute=1000), now=0.0)
    assert budget.try_take(0.0)  # in flight: the per-second window is full
    assert budget.next_available(0.0) == math.inf
    assert budget.next_available(0.0, urgent=True) == math.inf
    assert budget.next_available(0.0, urgent=True, behind_gate=True) == 0.0
    assert budget.next_available(0.0, behind_gate=True) == math.inf  # ordinary ones still wait here
    budget.pause_until(5.0)  # a gateway limit pauses every call of the app, urgent ones too
    assert budget.next_available(0.0, urgent=True, behind_gate=True) == 5.0
