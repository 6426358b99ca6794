"""DeliveryScheduler: per-message pacing, newest state wins, priorities, outcome handling, flush."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math

import pytest

from feishu_progress.backoff import BackoffPolicy
from feishu_progress.config import RateSettings
from feishu_progress.domain import TaskStatus
from feishu_progress.ports import OutcomeKind, WriteOutcome
from feishu_progress.progress.breaker import OutageBreaker
from feishu_progress.progress.live_card import LiveCard
from feishu_progress.progress.slots import CardSlots
from tests.fakes import rate_with_api
from tests.test_scheduler_fakes import Harness, PatchRecord, SplitWriter, finish, outcome, push
from tests.test_scheduler_fakes import step as record_step

RUNNING = TaskStatus.RUNNING
EPS = 1e-6


def step(card: LiveCard, n: int) -> None:
    record_step(card, n)


def assert_never_overlapping(records: list[PatchRecord], interval: float = 0.25) -> None:
    for before, after in itertools.pairwise(records):
        assert before.ended is not None
        assert after.started >= before.ended - EPS, "two PATCHes of one message overlapped"
        assert after.started - before.started >= interval - EPS, "PATCH starts closer than the interval"


# -- pacing and newest-state-wins ------------------------------------------------------------------


async def test_100_updates_in_one_second_give_at_most_5_patches_and_the_last_carries_the_last_state() -> None:
    async with Harness(delay=0.05) as h:
        card = h.card()
        for n in range(100):
            step(card, n)
            await h.clock.advance(0.01)
        await h.clock.advance(2.0)

        records = h.sink.of("om_1")
        assert 2 <= len(records) <= 5
        assert h.sink.max_in_flight_per_message == 1
        assert records[-1].card["content"] == "step 99"
        assert_never_overlapping(records)


async def test_a_slow_sink_never_sees_two_patches_of_one_message_in_flight() -> None:
    async with Harness(delay=0.6) as h:
        card = h.card()
        for n in range(60):
            step(card, n)
            await h.clock.advance(0.05)
        await h.clock.advance(3.0)

        records = h.sink.of("om_1")
        assert h.sink.max_in_flight_per_message == 1
        assert_never_overlapping(records)
        # 3 s of updates with 0.6 s PATCHes: about five flights, not sixty.
        assert 4 <= len(records) <= 7
        assert records[-1].card["content"] == "step 59"


async def test_a_card_re_attached_under_a_new_live_card_is_still_delivered() -> None:
    """A click on an evicted task (or a retry that revives it) builds a new LiveCard for the message."""
    async with Harness() as h:
        first = h.card()
        finish(first, TaskStatus.FAILED, h.clock, content="boom")
        await h.clock.advance(0.1)  # the final is delivered; the slot stays until its interval passes
        again = h.card()  # the task re-attached: a new live card of the same message
        step(again, 1)  # the retry's notice
        await h.clock.advance(0.01)
        step(again, 2)  # the revived task runs again
        await h.clock.advance(2.0)
        assert h.sink.of("om_1")[-1].card["content"] == "step 2"
        assert h.scheduler.pending_message_ids() == []


async def test_the_final_state_is_delivered_when_it_lands_mid_flight() -> None:
    async with Harness(delay=0.5) as h:
        card = h.card()
        step(card, 1)
        await h.clock.advance(0.1)
        assert len(h.sink.records) == 1 and h.sink.records[0].ended is None  # in flight
        finish(card, TaskStatus.COMPLETED, h.clock, content="done")
        await h.clock.advance(2.0)

        records = h.sink.of("om_1")
        assert [r.card["status"] for r in records] == ["RUNNING", "COMPLETED"]
        assert records[-1].card["content"] == "done"
        assert h.scheduler.pending_message_ids() == []


async def test_an_unchanged_card_is_not_patched_again() -> None:
    async with Harness() as h:
        card = h.card()
        step(card, 1)
        await h.clock.advance(1.0)
        step(card, 1)  # same state: nothing recorded
        push(card, disliked=False)  # already not disliked
        await h.clock.advance(1.0)
        assert len(h.sink.records) == 1


# -- priorities under a tight budget -----------------------------------------------------------------


async def test_terminal_and_urgent_cards_go_before_ordinary_ones_then_the_longest_waiting() -> None:
    async with Harness(rate=RateSettings(app_per_second=1, app_per_minute=60)) as h:
        first, a, b, urgent, done = (h.card(m) for m in ("om_x", "om_a", "om_b", "om_u", "om_t"))
        step(first, 1)
        await h.clock.advance(0.01)  # om_x takes the only token of this second
        step(a, 1)
        await h.clock.advance(0.01)
        step(b, 1)
        await h.clock.advance(0.01)
        push(urgent, urgent=True, round=7)  # a click the runtime should see reflected at once
        await h.clock.advance(0.01)
        finish(done, TaskStatus.FAILED, h.clock, error="boom")
        await h.clock.advance(10.0)

        order = [r.message_id for r in h.sink.records]
        assert order[0] == "om_x"
        assert set(order[1:3]) == {"om_u", "om_t"}
        assert order[3:] == ["om_a", "om_b"]
        starts = [r.started for r in h.sink.records]
        assert all(later - earlier >= 1.0 - EPS for earlier, later in itertools.pairwise(starts))


async def test_fairness_under_ten_times_the_budget() -> None:
    per_minute, cards_n, window = 120, 10, 120.0
    rate = RateSettings(app_per_second=10, app_per_minute=per_minute)
    async with Harness(rate=rate, delay=0.1) as h:
        cards = [h.card(f"om_{i}") for i in range(cards_n)]
        n = 0
        while h.clock.monotonic() < 1000.0 + window:
            n += 1
            for card in cards:
                step(card, n)  # every card changes every 50 ms: 40 PATCH/s wanted, 2/s allowed
            await h.clock.advance(0.05)

        starts = [r.started - 1000.0 for r in h.sink.records if r.started < 1000.0 + window]
        budget = per_minute * window / 60.0
        assert budget * 0.95 <= len(starts) <= budget
        for t in starts:  # never more than the limits in any sliding window
            assert sum(1 for s in starts if t <= s < t + 1.0) <= 10
            assert sum(1 for s in starts if t <= s < t + 60.0) <= per_minute
        allowed_gap = cards_n / (per_minute / 60.0) * 2.0
        for card in cards:
            times = [1000.0] + [r.started for r in h.sink.of(card.message_id)] + [1000.0 + window]
            assert max(b - a for a, b in itertools.pairwise(times)) <= allowed_gap, card.message_id

        for card in cards:
            finish(card, TaskStatus.COMPLETED, h.clock, content=f"final {card.message_id}")
        await h.clock.advance(30.0)
        for card in cards:
            last = h.sink.of(card.message_id)[-1].card
            assert (last["status"], last["content"]) == ("COMPLETED", f"final {card.message_id}")


async def test_what_a_write_left_owed_keeps_its_place_in_line_ahead_of_later_changes() -> None:
    async with Harness(rate=RateSettings(app_per_second=1, app_per_minute=60)) as h:
        a, b = h.card("om_a"), h.card("om_b")
        h.sink.answer("om_a", outcome(OutcomeKind.PARTIAL))  # its first write leaves part of it owed
        step(a, 1)
        await h.clock.advance(0.5)
        step(b, 1)  # changes after a's rest became owed
        await h.clock.advance(3.0)
        assert [r.message_id for r in h.sink.records[:3]] == ["om_a", "om_a", "om_b"]


def test_a_card_among_the_ready_ones_is_put_back_in_line_by_its_newest_change() -> None:
    h = Harness()
    slots = CardSlots()
    owed, later = h.card("om_owed"), h.card("om_later")
    slot = slots.slot(owed)
    slot.settled_version, slot.follow_up_at = owed.version, 0.0  # only the writer's rest was due
    slots.queue.put_ready(slot)  # as a pass leaves a card whose budget is spent: no change to date it by
    push(owed, content="new")
    slots.changed(owed, urgent=False, now=7.0)
    push(later, content="newer")
    slots.changed(later, urgent=False, now=8.0)
    slots.queue.due(9.0)
    first, second = slots.queue.pop(), slots.queue.pop()
    assert first is not None and second is not None
    assert (first.card.message_id, second.card.message_id) == ("om_owed", "om_later")


def test_a_change_wakes_a_card_waiting_for_a_budget_only_when_it_may_offer_another_choice() -> None:
    h = Harness()
    slots = CardSlots()
    card = h.card("om_s", writer=SplitWriter(h.sink, "om_s", interval=0.25))
    push(card, content="a")
    assert slots.changed(card, urgent=False, now=1.0)  # queued
    slot = slots.slot(card)
    slot.waiting_apis = frozenset({"card_update"})  # a pass left it waiting for the whole write only
    push(card, content="ab")
    assert slots.changed(card, urgent=False, now=2.0)  # new text: the text alone may have room
    slot.waiting_apis = frozenset({"card_update", "card_content"})  # it waited for either already
    push(card, content="abc")
    assert not slots.changed(card, urgent=False, now=3.0)  # the pass would find the same budgets spent


async def test_a_card_owing_its_rest_waits_briefly_for_the_whole_write_but_not_for_a_spent_minute() -> None:
    async with Harness(rate=rate_with_api("card_update", 2, 120)) as h:
        writer = SplitWriter(h.sink, "om_s", interval=0.25)
        card = h.card("om_s", writer=writer)
        step(card, 1)
        await h.clock.settle()
        update = h.scheduler.budget_of("card_update")
        now = h.clock.monotonic()
        while update.try_take(now):  # another spender takes the rest of this second's updates
            update.settle(now)
        for n, at in ((2, 0.3), (3, 0.6), (4, 0.9)):
            await h.clock.advance(at - (h.clock.monotonic() - now))
            step(card, n)
        await h.clock.advance(1.0)
        calls = [(api, round(t - now, 2)) for api, t in writer.calls]
        # 0.3 and 0.6: the whole write is 0.7 and 0.4 s away, longer than the card's interval, so the
        # text goes alone; 0.9: 0.1 s away, so the card waits for it instead of owing its rest again.
        assert calls == [
            ("card_update", 0.0),
            ("card_content", 0.3),
            ("card_content", 0.6),
            ("card_update", 1.0),
        ]


# -- outcome handling ------------------------------------------------------------------------------


async def test_retry_message_waits_retry_after_then_sends_the_newest_state() -> None:
    async with Harness() as h:
        card = h.card()
        h.sink.answer("om_1", outcome(OutcomeKind.RETRY_MESSAGE, retry_after=2.0))
        step(card, 1)
        await h.clock.advance(0.5)
        step(card, 2)
        await h.clock.advance(1.4)
        assert len(h.sink.records) == 1
        await h.clock.advance(0.2)
        records = h.sink.records
        assert len(records) == 2
        assert records[1].started - records[0].started >= 2.0 - EPS
        assert records[1].card["content"] == "step 2"
        assert h.metrics.value("fp_rate_limit_hits_total", {"kind": "message"}) == 1


async def test_a_held_card_sends_nothing_before_the_deadline_then_its_newest_state() -> None:
    """A card taken from a dead instance: the hold is a deadline fixed at the take, so time spent
    loading the card counts towards it (the first write is not pushed later by the load)."""
    async with Harness() as h:
        card = h.card()
        h.scheduler.hold(card, h.clock.monotonic() + 1.5)
        step(card, 1)
        await h.clock.advance(1.0)
        step(card, 2)
        await h.clock.advance(0.49)
        assert h.sink.records == []
        await h.clock.advance(0.02)
        (first,) = h.sink.records
        assert first.started >= 1000.0 + 1.5 - EPS
        assert first.card["content"] == "step 2"


async def test_a_card_feishu_fences_itself_is_not_held() -> None:
    async with Harness() as h:
        card = h.card()
        card.writer.refuses_stale_writes = True  # type: ignore[misc]  # a CardKit entity's writer
        h.scheduler.hold(card, h.clock.monotonic() + 1.5)
        step(card, 1)
        await h.clock.advance(0.1)
        assert len(h.sink.records) == 1


class HoldingGate:
    """A cluster gate whose shared budget lets no ordinary call through until ``open``; urgent ones pass."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.urgent_entered = 0

    async def enter(self, api: str, *, urgent: bool) -> object | None:
        if urgent:
            self.urgent_entered += 1
        else:
            await self.opened.wait()
        return object()

    def leave(self, grant: object) -> None:
        return None

    def paused(self, api: str, seconds: float) -> None:
        return None


async def test_behind_a_gate_an_urgent_card_is_not_held_by_ordinary_flights_queued_at_the_gate() -> None:
    """Cluster mode: ordinary flights waiting at the shared budget fill the local window; a card just
    taken over (urgent) must still go at once: the shared budget, not the local one, holds it."""
    gate = HoldingGate()
    async with Harness(rate=RateSettings(app_per_second=2, app_per_minute=1000), gate=gate) as h:
        ordinary = [h.card(f"om_{n}") for n in range(2)]
        for card in ordinary:
            step(card, 1)
        await h.clock.advance(0.01)
        assert h.sink.records == []  # both launched, both waiting at the gate: the window is full
        taken = h.card("om_taken")
        push(taken, urgent=True, status=RUNNING, round=1, content="taken over")
        await h.clock.advance(0.01)
        assert [r.message_id for r in h.sink.records] == ["om_taken"]
        gate.opened.set()
        await h.clock.advance(0.01)
        assert len(h.sink.records) == 3


async def test_retry_message_never_retries_sooner_than_the_interval() -> None:
    async with Harness() as h:
        card = h.card()
        h.sink.answer("om_1", outcome(OutcomeKind.RETRY_MESSAGE, retry_after=0.0))
        step(card, 1)
        await h.clock.advance(1.0)
        first, second = h.sink.records
        assert second.started - first.started >= 0.25 - EPS


async def test_pause_app_pauses_every_card() -> None:
    async with Harness(delay=0.05) as h:
        a, b = h.card("om_a"), h.card("om_b")
        h.sink.answer("om_a", outcome(OutcomeKind.PAUSE_APP, retry_after=3.0))
        step(a, 1)
        await h.clock.advance(0.1)  # om_a answered: the app is paused until ~1003.05
        step(b, 1)
        await h.clock.advance(2.8)
        assert [r.message_id for r in h.sink.records] == ["om_a"]
        await h.clock.advance(0.5)
        assert sorted(r.message_id for r in h.sink.records[1:]) == ["om_a", "om_b"]
        assert all(r.started >= 1003.05 - EPS for r in h.sink.records[1:])
        assert h.metrics.value("fp_rate_limit_hits_total", {"kind": "app"}) == 1


async def test_backoff_is_bounded_jittered_and_gives_up_with_a_log(caplog: pytest.LogCaptureFixture) -> None:
    # One card failing while the app as a whole is fine: its own backoff, not the outage breaker.
    policy = BackoffPolicy(base_seconds=0.5, max_seconds=4.0, max_attempts=8)
    async with Harness(backoff=policy, breaker=OutageBreaker(threshold=1000)) as h:
        card = h.card()
        h.sink.always["om_1"] = outcome(OutcomeKind.BACKOFF, reason="HTTP 502")
        with caplog.at_level(logging.WARNING):
            step(card, 1)
            await h.clock.advance(120.0)

        starts = [r.started for r in h.sink.records]
        assert len(starts) == 8
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        for attempt, gap in enumerate(gaps, start=1):
            ceiling = min(4.0, 0.5 * 2 ** (attempt - 1))
            assert max(0.25, ceiling * 0.5) - EPS <= gap <= ceiling + EPS
        assert any("giving up" in r.getMessage() and "om_1" in r.getMessage() for r in caplog.records)
        assert h.metrics.value("fp_delivery_give_ups_total", {"reason": "attempts_exhausted"}) == 1
        assert card.stopped_reason is None

        del h.sink.always["om_1"]
        step(card, 2)  # a newer state gets fresh attempts
        await h.clock.advance(1.0)
        assert h.sink.records[-1].card["content"] == "step 2"
        assert h.sink.records[-1].outcome == WriteOutcome.delivered()


async def test_a_final_state_never_gives_up_while_progress_does() -> None:
    policy = BackoffPolicy(base_seconds=0.5, max_seconds=2.0, max_attempts=3)
    async with Harness(backoff=policy, breaker=OutageBreaker(threshold=1000)) as h:
        card = h.card()
        h.sink.answer("om_1", *[outcome(OutcomeKind.BACKOFF)] * 30)
        finish(card, TaskStatus.COMPLETED, h.clock)
        await h.clock.advance(120.0)
        assert len(h.sink.records) == 31
        assert h.sink.records[-1].outcome == WriteOutcome.delivered()
        assert h.sink.records[-1].card["status"] == "COMPLETED"


async def test_stop_stops_that_card_only_and_tells_the_owner(caplog: pytest.LogCaptureFixture) -> None:
    async with Harness() as h:
        gone, alive = h.card("om_gone"), h.card("om_alive")
        h.sink.answer("om_gone", outcome(OutcomeKind.STOP, reason="message recalled"))
        with caplog.at_level(logging.WARNING):
            step(gone, 1)
            step(alive, 1)
            await h.clock.advance(1.0)
        step(gone, 2)
        step(alive, 2)
        await h.clock.advance(1.0)

        assert len(h.sink.of("om_gone")) == 1
        assert [r.card["content"] for r in h.sink.of("om_alive")] == ["step 1", "step 2"]
        assert gone.stopped_reason == "message recalled"
        assert h.stopped == [("om_gone", "message recalled")]
        assert any("om_gone" in r.getMessage() and "recalled" in r.getMessage() for r in caplog.records)


async def test_degrade_resends_once_as_the_degraded_card() -> None:
    async with Harness() as h:
        card = h.card()
        h.sink.answer("om_1", outcome(OutcomeKind.DEGRADE, reason="card too large"))
        step(card, 1)
        await h.clock.advance(1.0)
        kinds = [r.card["kind"] for r in h.sink.records]
        assert kinds == ["full", "degraded"]
        assert h.sink.records[-1].card["content"] == "step 1"
        finish(card, TaskStatus.COMPLETED, h.clock)
        await h.clock.advance(1.0)
        assert h.sink.records[-1].card == {"kind": "degraded", "status": "COMPLETED", "content": "step 1"}
        assert card.stopped_reason is None


async def test_a_rejected_degraded_card_stops_the_card() -> None:
    async with Harness() as h:
        card = h.card()
        h.sink.answer("om_1", outcome(OutcomeKind.DEGRADE), outcome(OutcomeKind.DEGRADE, reason="still bad"))
        step(card, 1)
        await h.clock.advance(1.0)
        step(card, 2)
        await h.clock.advance(1.0)
        assert len(h.sink.records) == 2
        assert card.stopped_reason is not None and "still bad" in card.stopped_reason
        assert [m for m, _ in h.stopped] == ["om_1"]


async def test_a_builder_crash_falls_back_to_the_degraded_card() -> None:
    async with Harness() as h:
        card = h.card()

        def broken(_: object) -> dict[str, object]:
            raise ValueError("builder bug")

        card._build_card = broken
        step(card, 1)
        await h.clock.advance(1.0)
        assert [r.card["kind"] for r in h.sink.records] == ["degraded"]


async def test_a_raising_sink_is_treated_as_transient() -> None:
    async with Harness() as h:
        card = h.card()
        h.sink.answer("om_1", ConnectionResetError("reset"))
        step(card, 1)
        await h.clock.advance(5.0)
        assert [r.outcome for r in h.sink.records] == [None, WriteOutcome.delivered()]


# -- metrics and flush -----------------------------------------------------------------------------


async def test_metrics_count_outcomes_pending_cards_and_staleness() -> None:
    async with Harness(delay=0.1) as h:
        card = h.card()
        step(card, 1)
        await h.clock.advance(0.05)
        assert h.metrics.value("fp_pending_cards") == 1
        await h.clock.advance(1.0)
        step(card, 2)
        await h.clock.advance(1.0)
        assert h.metrics.value("fp_patches_total", {"outcome": "delivered"}) == 2
        assert h.metrics.value("fp_delivery_staleness_seconds_count") == 2
        assert h.metrics.value("fp_delivery_staleness_seconds_sum") == pytest.approx(0.2)
        await h.clock.advance(0.01)
        step(card, 3)
        await h.clock.advance(1.0)
        assert h.metrics.value("fp_pending_cards") == 0


async def test_flush_delivers_every_pending_terminal_state_within_the_deadline() -> None:
    rate = RateSettings(app_per_second=5, app_per_minute=300)
    h = Harness(rate=rate, delay=0.1)
    h.scheduler.start()
    cards = [h.card(f"om_{i}") for i in range(12)]
    for card in cards:
        step(card, 1)
    for card in cards:
        finish(card, TaskStatus.COMPLETED, h.clock)
    flushing = asyncio.create_task(h.scheduler.flush(5.0))
    await h.clock.advance(6.0)
    report = await flushing

    assert report.complete
    for card in cards:
        assert h.sink.of(card.message_id)[-1].card["status"] == "COMPLETED"
    assert max(r.started for r in h.sink.records) <= 1005.0
    assert not h.scheduler.running


async def test_flush_reports_what_it_could_not_deliver() -> None:
    h = Harness()
    ok, stuck, busy = h.card("om_ok"), h.card("om_stuck"), h.card("om_busy")
    h.sink.always["om_stuck"] = outcome(OutcomeKind.BACKOFF)
    h.sink.always["om_busy"] = outcome(OutcomeKind.PAUSE_APP, retry_after=30.0)
    finish(ok, TaskStatus.COMPLETED, h.clock)
    finish(stuck, TaskStatus.FAILED, h.clock)
    step(busy, 1)
    flushing = asyncio.create_task(h.scheduler.flush(2.0))
    await h.clock.advance(3.0)
    report = await flushing

    assert report.undelivered_terminal == ("om_stuck",)
    assert report.undelivered_other == ("om_busy",)
    assert not report.complete
    assert h.sink.of("om_ok")[-1].outcome == WriteOutcome.delivered()


async def test_a_patch_cut_short_by_stop_is_sent_again_after_a_restart() -> None:
    h = Harness(delay=1.0)
    h.scheduler.start()
    card = h.card()
    step(card, 1)
    await h.clock.advance(0.5)
    await h.scheduler.stop()
    assert h.scheduler.pending_message_ids() == ["om_1"]
    h.scheduler.start()
    await h.clock.advance(2.0)
    assert [r.card["content"] for r in h.sink.records] == ["step 1", "step 1"]
    assert h.sink.records[-1].outcome == WriteOutcome.delivered()
    assert h.scheduler.pending_message_ids() == []
    await h.scheduler.stop()


def test_a_budget_slot_frees_one_window_after_the_request_ended_not_started() -> None:
    from feishu_progress.progress.rate_budget import SlidingWindow

    window = SlidingWindow(limit=2, window=1.0)
    window.record(0.0)
    window.record(0.0)
    assert window.next_free(0.5) == math.inf  # both slots held by requests still in flight
    window.settle(0.3)  # the first answer came back at 0.3: the gateway saw it by then at the latest
    assert window.next_free(0.5) == 1.3
    window.settle(0.4)
    assert window.next_free(1.0) == 1.3
    assert window.next_free(1.3) == 1.3  # the first slot is free again; the second frees at 1.4


# -- the app-wide outage breaker ---------------------------------------------------------------------


async def test_an_outage_for_every_card_opens_the_breaker_probes_slowly_and_recovers_all_at_once() -> None:
    async with Harness() as h:
        cards = [h.card(f"om_{n}") for n in range(8)]
        for message_id in (card.message_id for card in cards):
            h.sink.always[message_id] = outcome(OutcomeKind.BACKOFF, reason="HTTP 503")
        for card in cards:
            step(card, 1)
        await h.clock.advance(2.0)
        assert h.scheduler.breaker.is_open
        assert h.metrics.value("fp_breaker_open") == 1
        opened_at = h.clock.monotonic()
        for card in cards:
            finish(card, TaskStatus.COMPLETED, h.clock)
        await h.clock.advance(20.0)
        during = [r.started for r in h.sink.records if r.started >= opened_at]
        assert len(during) <= 20 / 2 + 1  # one probe at a time, at most one per 2 s
        assert all(b - a >= 2.0 - EPS for a, b in itertools.pairwise(during))
        h.sink.always.clear()  # Feishu answers again
        back = h.clock.monotonic()
        await h.clock.advance(5.0)
        assert not h.scheduler.breaker.is_open and h.metrics.value("fp_breaker_open") == 0
        for card in cards:
            last = h.sink.of(card.message_id)[-1]
            assert last.card["status"] == "COMPLETED" and last.outcome == WriteOutcome.delivered()
            assert last.started <= back + 2.0 + 1.0  # the next probe, then everyone at once
        assert h.metrics.value("fp_delivery_give_ups_total", {"reason": "attempts_exhausted"}) == 0
