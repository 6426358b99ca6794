"""LiveCard: seed 002 §6.1 patched-progress rows, plus recording, elapsed time, hooks and the registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from feishu_progress.domain import Notice, PendingApproval, PendingAsk, SubagentSummary, TaskStatus
from feishu_progress.metrics import Metrics
from feishu_progress.progress import CardContext, CardState, LiveCard, LiveCardRegistry
from tests.fakes import FakeClock
from tests.test_scheduler_fakes import FakeSubagents, Harness, build_card, build_degraded_card, subagent

RUNNING = TaskStatus.RUNNING


def lone_card(clock: FakeClock, source: FakeSubagents | None = None, **kwargs: object) -> LiveCard:
    """A card with no scheduler: only records and builds."""
    context = CardContext(session_id=7, message_id="om_7", title="t", started_at=clock.wall())
    return LiveCard(
        context,
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
        card.update(RUNNING, 3, "working", ())
        await h.clock.advance(1.0)
        assert h.sink.records[-1].card["subagents"] == [1, 2]
        assert card.render_current()["subagents"] == [1, 2]


async def test_a_throwing_loader_still_patches_and_keeps_the_last_snapshot() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.answers.extend([RuntimeError("db down"), [subagent(5)], RuntimeError("db down again")])
        card = h.card(subagents=source)
        for n in range(3):
            card.update(RUNNING, n, f"step {n}", ())
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
            card.update(RUNNING, n, f"step {n}", ())
            await h.clock.advance(0.3)
        assert len(h.sink.records) == 3
        assert source.calls == 1
        await h.clock.advance(1.0)
        card.update(RUNNING, 9, "later", ())
        await h.clock.advance(0.3)
        assert source.calls == 2


async def test_render_current_uses_the_cache_and_never_loads() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock)
    source.fallback = [subagent(4)]
    card = lone_card(clock, source)
    card.update(RUNNING, 1, "x", ())
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
        card.update(RUNNING, 1, "x", ())
        await h.clock.advance(1.5)
        card.finish(TaskStatus.COMPLETED, content="done")
        await h.clock.advance(1.5)
        assert h.sink.records[-1].card["subagents"] == []
        assert h.sink.records[-1].card["status"] == "COMPLETED"
        assert card.render_current()["subagents"] == []
        assert card.subagents == ()
        assert source.calls == 1  # terminal states never load


async def test_refresh_forces_a_reload_and_an_urgent_patch() -> None:
    async with Harness() as h:
        source = FakeSubagents(h.clock)
        source.answers.extend([[subagent(1)], [subagent(1), subagent(2)]])
        card = h.card(subagents=source)
        card.update(RUNNING, 1, "x", ())
        await h.clock.advance(0.3)
        await card.refresh()  # within the 1 s cache, yet reloads
        await h.clock.advance(0.3)
        assert source.calls == 2
        assert [r.card["subagents"] for r in h.sink.records] == [[1], [1, 2]]


async def test_at_most_one_load_in_flight() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock, delay=0.5)
    source.fallback = [subagent(3)]
    card = lone_card(clock, source)
    card.update(RUNNING, 1, "x", ())
    builds = [asyncio.create_task(card.build_for_delivery()) for _ in range(3)]
    refresh = asyncio.create_task(card.refresh())
    await clock.advance(1.0)
    deliveries = await asyncio.gather(*builds)
    await refresh
    assert source.max_in_flight == 1
    assert source.calls == 1
    assert all(d.card["subagents"] == [3] for d in deliveries)


async def test_a_load_that_ends_after_the_task_finished_does_not_bring_subagents_back() -> None:
    clock = FakeClock()
    source = FakeSubagents(clock, delay=0.5)
    source.fallback = [subagent(3)]
    card = lone_card(clock, source)
    card.update(RUNNING, 1, "x", ())
    build = asyncio.create_task(card.build_for_delivery())
    await clock.advance(0.1)
    card.finish(TaskStatus.CANCELLED)
    await clock.advance(1.0)
    delivery = await build
    assert delivery.card["subagents"] == []
    assert delivery.card["status"] == "CANCELLED"
    assert card.render_current()["subagents"] == []


# -- recording ---------------------------------------------------------------------------------------


async def test_setters_record_the_newest_state_for_the_builder() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    card.update(TaskStatus.WAITING, 4, "question?", ())
    card.set_pending_asks([PendingAsk("ask-1", ())])
    card.set_approvals([PendingApproval("ap-1", "mcp:github")])
    card.set_notice(Notice.ANSWERS_SUBMITTED)
    card.set_disliked()
    card.set_image_keys({"/tmp/cat.png": "img_v2_1"})
    card.set_error("partial")
    built = card.render_current()
    assert built["status"] == "WAITING" and built["round"] == 4
    assert built["asks"] == ["ask-1"] and built["approvals"] == ["ap-1"]
    assert built["notice"] == "answers_submitted" and built["disliked"] is True
    assert built["image_keys"] == {"/tmp/cat.png": "img_v2_1"} and built["error"] == "partial"
    assert card.version == 7


async def test_finish_keeps_content_unless_given_and_rejects_a_live_status() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    card.update(RUNNING, 2, "so far", ())
    card.set_pending_asks([PendingAsk("ask-1", ())])
    with pytest.raises(ValueError, match="terminal"):
        card.finish(RUNNING)
    card.finish(TaskStatus.FAILED, error="tool crashed")
    assert card.state.content == "so far"
    assert card.state.error == "tool crashed"
    assert card.state.pending_asks == ()
    assert card.is_terminal


async def test_elapsed_time_runs_from_started_at_and_freezes_at_finish() -> None:
    clock = FakeClock()
    card = lone_card(clock)
    await clock.advance(192.5)
    assert card.render_current()["elapsed_ms"] == 192_500
    card.finish(TaskStatus.COMPLETED)
    await clock.advance(3600.0)
    assert card.render_current()["elapsed_ms"] == 192_500


async def test_on_change_sees_every_recorded_change_and_a_failing_hook_does_not_break_recording() -> None:
    clock = FakeClock()
    seen: list[CardState] = []

    def hook(card: LiveCard) -> None:
        seen.append(card.state)
        if len(seen) == 2:
            raise RuntimeError("db hiccup")

    card = lone_card(clock, on_change=hook)
    card.update(RUNNING, 1, "a", ())
    card.update(RUNNING, 1, "a", ())  # no change: no hook, no version
    card.update(RUNNING, 2, "b", ())
    card.set_disliked()
    assert [s.round for s in seen] == [1, 2, 2]
    assert seen[-1].disliked is True
    assert card.version == 3


async def test_a_restored_card_starts_from_its_persisted_state() -> None:
    clock = FakeClock()
    saved = CardState(status=RUNNING, round=12, content="before the restart")
    card = lone_card(clock, state=saved)
    assert card.render_current()["content"] == "before the restart"
    assert card.version == 0  # nothing new to deliver until the next change


async def test_the_registry_finds_cards_by_session_and_message_and_counts_them() -> None:
    clock = FakeClock()
    metrics = Metrics()
    registry = LiveCardRegistry(metrics)
    card = lone_card(clock)
    registry.add(card)
    assert registry.get(7) is card and registry.by_message("om_7") is card and 7 in registry
    assert metrics.value("fp_live_cards") == 1
    assert registry.remove(7) is card
    assert registry.by_message("om_7") is None and len(registry) == 0
    assert metrics.value("fp_live_cards") == 0


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
        card.update(RUNNING, 1, "working", ())
        await h.clock.advance(0.1)  # the delivery's load is reading [1]
        source.rows = [1, 2]  # the second subagent is written meanwhile...
        card.subagents_changed()  # ...and the service says so
        await h.clock.advance(2.0)
        # The stale list went out at most once; the card was delivered again with both subagents.
        assert h.sink.records[-1].card["subagents"] == [1, 2]
        assert source.calls == 2
