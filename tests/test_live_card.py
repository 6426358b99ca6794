"""LiveCard: seed 002 §6.1 patched-progress rows, recording, elapsed time, and the subagent degrade.

Every change goes through ``record`` (what the task service calls) or ``subagents_changed``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from sqlalchemy import text

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import SubagentRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.domain import Notice, PendingApproval, PendingAsk, SubagentSummary, TaskStatus
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.subagents.batcher import BatchedSubagentSource
from feishu_progress.subagents.manager import SubagentManager
from tests.fakes import FakeClock, card_state
from tests.test_scheduler_fakes import (
    FakeSink,
    FakeSubagents,
    Harness,
    build_card,
    build_degraded_card,
    finish,
    push,
    step,
    subagent,
)

RUNNING = TaskStatus.RUNNING


def lone_card(clock: FakeClock, source: FakeSubagents | None = None, **kwargs: object) -> LiveCard:
    """A card with no scheduler: only records and builds."""
    context = CardContext(session_id=7, message_id="om_7", title="t", started_at=clock.wall())
    return LiveCard(
        context,
        writer=FakeSink(clock).writer("om_7"),
        clock=clock,
        build_card=build_card,
        build_degraded_card=build_degraded_card,
        subagents=source,
        **kwargs,  # type: ignore[arg-type]
    )


# -- seed 002 §6.1, patched-progress rows -----------------------------------------------------------


async def test_build_card_receives_the_loaded_subagents() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.fallback = [subagent(1), subagent(2)]
        card = h.card(subagents=source)
        push(card, round=3, content="working")
        await h.clock.advance(1.0)
        assert h.sink.records[-1].card["subagents"] == [1, 2]
        assert card.render_current()["subagents"] == [1, 2]


async def test_a_throwing_loader_still_patches_and_keeps_the_last_snapshot() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.answers.extend([RuntimeError("db down"), [subagent(5)], RuntimeError("db down again")])
        card = h.card(subagents=source)
        for n in range(3):
            step(card, n)
            await h.clock.advance(1.5)  # past the 1 s cache: every PATCH loads
        assert source.calls == 3
        assert [r.card["subagents"] for r in h.sink.records] == [[], [5], [5]]
        assert [r.card["content"] for r in h.sink.records] == ["step 0", "step 1", "step 2"]


async def test_several_updates_within_one_second_load_once() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.fallback = [subagent(1)]
        card = h.card(subagents=source)
        for n in range(3):
            step(card, n)
            await h.clock.advance(0.3)
        assert len(h.sink.records) == 3
        assert source.calls == 1
        await h.clock.advance(1.0)
        step(card, 9)
        await h.clock.advance(0.3)
        assert source.calls == 2


async def test_render_current_uses_the_cache_and_never_loads() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock)
    source.fallback = [subagent(4)]
    card = lone_card(clock, source)
    step(card, 1)
    assert card.render_current()["subagents"] == []  # nothing loaded yet, and render does not load
    await card.build_for_delivery()
    await clock.advance(5.0)  # cache long expired: render still does not load
    assert card.render_current()["subagents"] == [4]
    assert source.calls == 1


async def test_a_terminal_update_shows_no_subagents_and_neither_does_render_current() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.fallback = [subagent(1), subagent(2)]
        card = h.card(subagents=source)
        step(card, 1)
        await h.clock.advance(1.5)
        finish(card, TaskStatus.COMPLETED, h.clock, content="done")
        await h.clock.advance(1.5)
        assert h.sink.records[-1].card["subagents"] == []
        assert h.sink.records[-1].card["status"] == "COMPLETED"
        assert card.render_current()["subagents"] == []
        assert card.subagents == ()
        assert source.calls == 1  # terminal states never load


async def test_a_subagent_change_drops_the_cache_and_the_next_delivery_reloads() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.answers.extend([[subagent(1)], [subagent(1), subagent(2)]])
        card = h.card(subagents=source)
        step(card, 1)
        await h.clock.advance(0.3)
        card.subagents_changed()  # within the 1 s cache, yet the next delivery reloads
        await h.clock.advance(0.3)
        assert source.calls == 2
        assert [r.card["subagents"] for r in h.sink.records] == [[1], [1, 2]]


async def test_at_most_one_load_in_flight() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock, delay=0.5)
    source.fallback = [subagent(3)]
    card = lone_card(clock, source)
    step(card, 1)
    builds = [asyncio.create_task(card.build_for_delivery()) for _ in range(4)]
    await clock.advance(1.0)
    deliveries = await asyncio.gather(*builds)
    assert source.max_in_flight == 1
    assert source.calls == 1
    assert all(d.built.card["subagents"] == [3] for d in deliveries)


async def test_a_load_that_ends_after_the_task_finished_does_not_bring_subagents_back() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock, delay=0.5)
    source.fallback = [subagent(3)]
    card = lone_card(clock, source)
    step(card, 1)
    build = asyncio.create_task(card.build_for_delivery())
    await clock.advance(0.1)
    finish(card, TaskStatus.CANCELLED, clock)
    await clock.advance(1.0)
    delivery = await build
    assert delivery.built.card["subagents"] == []
    assert delivery.built.card["status"] == "CANCELLED"
    assert card.render_current()["subagents"] == []


# -- recording ---------------------------------------------------------------------------------------


async def test_record_carries_every_field_to_the_builder_and_counts_versions() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    before = card.version
    card.record(
        card_state(
            status=TaskStatus.WAITING,
            round=4,
            content="question?",
            pending_asks=(PendingAsk("ask-1", ()),),
            pending_approvals=(PendingApproval("ap-1", "mcp:github"),),
            notice=Notice.ANSWERS_SUBMITTED,
            disliked=True,
            image_keys={"/tmp/cat.png": "img_v2_1"},
            error="partial",
        )
    )
    built = card.render_current()
    assert built["status"] == "WAITING" and built["round"] == 4
    assert built["asks"] == ["ask-1"] and built["approvals"] == ["ap-1"]
    assert built["notice"] == "answers_submitted" and built["disliked"] is True
    assert built["image_keys"] == {"/tmp/cat.png": "img_v2_1"} and built["error"] == "partial"
    assert card.version > before  # one change, one new version


async def test_recording_an_unchanged_state_is_nothing() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    step(card, 1)
    after_one_change = card.version
    step(card, 1)
    assert card.version == after_one_change


async def test_elapsed_time_runs_from_started_at_and_freezes_at_finish() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    await clock.advance(192.5)
    assert card.render_current()["elapsed_ms"] == 192_500
    finish(card, TaskStatus.COMPLETED, clock)
    await clock.advance(3600.0)
    assert card.render_current()["elapsed_ms"] == 192_500


async def test_a_restored_card_starts_from_its_persisted_state() -> None:
    clock = FakeClock()
    saved = card_state(status=RUNNING, round=12, content="before the restart")
    card = lone_card(clock, state=saved)
    restored_version = card.version
    assert card.render_current()["content"] == "before the restart"
    assert card.version == restored_version  # nothing new to deliver until the next change


class _SnapshotAtStart:
    """A source that reads its rows when the query starts, then takes ``delay`` to answer (like a DB)."""

    def __init__(self, clock: FakeClock, delay: float) -> None:
        self.clock = clock
        self.delay = delay
        self.rows: list[int] = []
        self.calls = 0

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        self.calls += 1
        seen = list(self.rows)
        await self.clock.sleep(self.delay)
        return [subagent(task_id) for task_id in seen]

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        return {sid: await self.list_running(sid) for sid in parent_session_ids}


async def test_a_subagent_that_starts_during_a_load_is_not_lost() -> None:
    async with Harness() as h:
        source = _SnapshotAtStart(h.clock, delay=0.2)
        source.rows = [1]
        card = h.card(subagents=source)  # type: ignore[arg-type]
        push(card, round=1, content="working")
        await h.clock.advance(0.1)  # the delivery's load is reading [1]
        source.rows = [1, 2]  # the second subagent is written meanwhile...
        card.subagents_changed()  # ...and the service says so
        await h.clock.advance(2.0)
        # The stale list went out at most once; the card was delivered again with both subagents.
        assert h.sink.records[-1].card["subagents"] == [1, 2]
        assert source.calls == 2


# -- the real manager, batcher and database: the subagent degrade happens in the live card only -------


async def _rename(db: Database, old: str, new: str) -> None:
    async with db.engine.begin() as connection:
        await connection.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))


async def test_a_database_blip_omits_the_subagent_list_until_the_database_answers(db: Database) -> None:
    clock = FakeClock()
    rows = SubagentRepository(db)
    now = utc_datetime(clock.wall())
    for ref in ("a", "b"):
        await rows.start(7, ref, None, "explorer", f"调研 {ref}", None, "BACKGROUND", now)
    batcher = BatchedSubagentSource(SubagentManager(db), clock, BackgroundTasks())

    def card_of(session_id: int) -> LiveCard:
        context = CardContext(session_id=session_id, message_id=f"om_{session_id}", started_at=clock.wall())
        card = LiveCard(
            context,
            writer=FakeSink(clock).writer(context.message_id),
            clock=clock,
            build_card=build_card,
            build_degraded_card=build_degraded_card,
            subagents=batcher,
        )
        step(card, 1)
        return card

    async def subagents_on(card: LiveCard) -> list[int]:
        delivery = asyncio.create_task(card.build_for_delivery())
        await clock.advance(1.5)  # past the 1 s cache and the batcher's spacing
        return list((await delivery).built.card["subagents"])

    seen = card_of(7)
    assert len(await subagents_on(seen)) == 2
    await _rename(db, "subagent_execution", "subagent_execution_gone")
    try:
        await clock.advance(1.5)  # the list loaded above is no longer cached
        # Seed 002 §5.1: the manager lists nothing and warns; a list that may be wrong is not kept as current.
        assert await subagents_on(seen) == []
        assert await subagents_on(card_of(8)) == []  # a first load: none
    finally:
        await _rename(db, "subagent_execution_gone", "subagent_execution")
    await rows.finish((await rows.find(7, "a")) or 0, "COMPLETED", 3, now)
    seen.subagents_changed()
    assert len(await subagents_on(seen)) == 1  # the database answers again
