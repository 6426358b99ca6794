"""The delivery scheduler: decides when each live card of one app may be written.

Rules (docs/architecture.md, "Flow" step 3):
- exactly one write in flight per card; the newest state wins (a write carries the state at build time,
  changes during the flight cause one more write afterwards);
- at least the card writer's ``interval`` between two write starts of one card;
- every Open API its own app-wide budget (``BudgetTable``): a write takes the budget of each API its
  writer will call before it starts, all or none (``CardWriter.choices``, best first), retries included;
- under pressure: terminal states and urgent refreshes first, then the card that has waited longest;
- every ``WriteOutcome`` is acted on, nothing is retried forever, every give-up is logged.

How a card is written (a PATCHed message, a CardKit entity) is its writer's business
(``progress/writer.py``): nothing here depends on the transport. One dispatcher task sleeps until it is
woken (a card changed, a write ended) or until the next card's time; a pass costs the cards whose time
has come (``slots.ReadyQueue``), never all cards. Writes run in a tracked task set. When a card is done
with — its final state delivered, or it can never be written again — a ``CardEnd`` goes into ``ends``,
which the task service reads (until the None that ``stop`` puts there).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from dataclasses import dataclass, field

from feishu_progress.background import BackgroundTasks
from feishu_progress.backoff import BackoffPolicy
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, OutcomeKind, WriteOutcome
from feishu_progress.progress.breaker import OutageBreaker
from feishu_progress.progress.outcomes import Done, Outcomes
from feishu_progress.progress.rate_budget import AppBudget, BudgetTable
from feishu_progress.progress.slots import CardSlot, CardSlots, Deliverable, FlightCalls
from feishu_progress.progress.writer import Delivery, DeliveryGate
from feishu_progress.waiting import event_or_timeout

log = logging.getLogger(__name__)

_MIN_SLEEP = 0.001  # never spin: a wake time already due still waits this long
NOT_NOW_SECONDS = 0.5  # a card the gate refused (no lease right now) is looked at again this much later


@dataclass(frozen=True, slots=True)
class CardEnd:
    """A card the scheduler is done with: its final state reached Feishu (``reason`` None), or it can
    never be written again (why)."""

    card: Deliverable
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class FlushReport:
    """What ``flush`` could not deliver before its deadline, by message id."""

    undelivered_terminal: tuple[str, ...] = ()
    undelivered_other: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every pending state reached Feishu."""
        return not self.undelivered_terminal and not self.undelivered_other


@dataclass(slots=True)
class _Events:
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the dispatcher should look again
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # a write ended (flush watches it)


class DeliveryScheduler:
    """Paces and budgets the writes of every live card of one app."""

    def __init__(
        self,
        budgets: BudgetTable,
        *,
        clock: Clock,
        metrics: Metrics | None = None,
        backoff: BackoffPolicy | None = None,
        rng: random.Random | None = None,
        default_pause_seconds: float = 1.0,
        breaker: OutageBreaker | None = None,
        gate: DeliveryGate | None = None,
    ) -> None:
        self._budgets = budgets  # shared with the app's ``Admission`` (sends, creates, uploads)
        self._clock = clock
        self._metrics = metrics if metrics is not None else Metrics()
        self.breaker = breaker if breaker is not None else OutageBreaker()
        self._gate = gate
        self._outcomes = Outcomes(
            budgets,
            metrics=self._metrics,
            backoff=backoff if backoff is not None else BackoffPolicy(),
            rng=rng if rng is not None else random.Random(),
            breaker=self.breaker,
            gate=gate,
            default_pause=default_pause_seconds,
        )
        self.ends: asyncio.Queue[CardEnd | None] = asyncio.Queue()  # None: stopped, no more for now
        self._slots = CardSlots()
        self._queue = self._slots.queue
        # The budgets some card's writes use: a pass stops early once each of them is spent.
        self._apis: set[str] = set()
        self._flights = BackgroundTasks()
        self._events = _Events()
        self._dispatcher: asyncio.Task[None] | None = None

    # -- public API -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._dispatcher is not None and not self._dispatcher.done()

    @property
    def has_gate(self) -> bool:
        """Whether writes pass a gate (cluster mode) besides the app's own budgets."""
        return self._gate is not None

    def budget_of(self, api: str) -> AppBudget:
        """One Open API's app-wide budget (read-only use outside the scheduler: admin pages, tests)."""
        return self._budgets.get(api, self._clock.monotonic())

    def start(self) -> None:
        """Start the dispatcher task (inside a running event loop)."""
        if not self.running:
            self._dispatcher = asyncio.create_task(self._dispatch_forever(), name="fp-delivery-dispatcher")

    async def stop(self) -> None:
        """Stop dispatching and cancel the writes still in flight."""
        await self._stop_dispatching()
        await self._flights.cancel_all()
        self.ends.put_nowait(None)

    async def _stop_dispatching(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None

    async def stop_and_report(self, wait_seconds: float) -> set[str]:
        """Stop launching, give the requests out ``wait_seconds`` to end, cancel the rest: their ids.

        A hand-over (cluster mode) releases every other card at once; a cancelled request may still land
        at Feishu, so its card is left for the next writer to take as from a dead owner (it waits first).
        Flights still building or waiting for the budget are cancelled at once: nothing of theirs left.
        """
        await self._stop_dispatching()
        deadline = self._clock.monotonic() + wait_seconds
        while self._slots.sending() and (remaining := deadline - self._clock.monotonic()) > 0:
            self._events.progress.clear()
            await event_or_timeout(self._events.progress, self._clock, remaining)
        still_sending = self._slots.sending()
        await self._flights.cancel_all()
        self.ends.put_nowait(None)
        return still_sending

    def notify(self, card: Deliverable, *, urgent: bool = False) -> None:
        """Note that ``card`` has a newer state; ``urgent`` puts it ahead of ordinary updates."""
        if card.stopped_reason is not None:
            return
        self._apis.update(card.writer.apis)
        if self._slots.changed(card, urgent=urgent, now=self._clock.monotonic()):
            self._events.wake.set()

    def hold(self, card: Deliverable, until: float) -> None:
        """Send nothing of ``card`` before ``until`` (the clock's monotonic time; a card taken from a dead
        instance: its last write may still be in flight), then its newest state. A card whose writes
        Feishu fences itself (``refuses_stale_writes``) has nothing to wait out."""
        if card.writer.refuses_stale_writes:
            return
        slot = self._slots.slot(card)
        self._apis.update(card.writer.apis)
        slot.next_start = max(slot.next_start, until)
        if slot.token != 0:
            self._queue.put(slot)  # at its new time

    def drop(self, message_id: str) -> None:
        """Forget a card this instance no longer writes (taken by another instance); a flight that has
        not sent yet sends nothing."""
        slot = self._slots.remove(message_id)
        if slot is not None:
            slot.dropped = True

    def pending_message_ids(self) -> list[str]:
        """Messages with a state not yet delivered (in flight or waiting)."""
        return [slot.card.message_id for slot in self._slots.undelivered()]

    async def flush(self, deadline_s: float) -> FlushReport:
        """Deliver what is pending (terminal states first) within ``deadline_s`` seconds, then stop."""
        self.start()
        deadline = self._clock.monotonic() + deadline_s
        while self._slots.undelivered_count() and (remaining := deadline - self._clock.monotonic()) > 0:
            self._events.progress.clear()
            await event_or_timeout(self._events.progress, self._clock, remaining)
        pending = self._slots.undelivered()
        report = FlushReport(
            tuple(slot.card.message_id for slot in pending if slot.card.is_terminal),
            tuple(slot.card.message_id for slot in pending if not slot.card.is_terminal),
        )
        await self.stop()
        for message_id in report.undelivered_terminal:
            log.error(
                "shutdown: final card state of message %s was not delivered",
                message_id,
                extra={"message_id": message_id},
            )
        if report.undelivered_other:
            log.warning("shutdown: %d cards still had undelivered progress", len(report.undelivered_other))
        return report

    # -- the dispatcher ---------------------------------------------------------------------------

    async def _dispatch_forever(self) -> None:
        while True:
            self._events.wake.clear()
            now = self._clock.monotonic()
            try:
                wake_at = self._launch_ready(now)
            except Exception:
                # One bad pass must not end every card's delivery: log it and look again shortly.
                log.exception("delivery dispatcher pass failed")
                wake_at = now + NOT_NOW_SECONDS
            self._metrics.pending_cards.set(self._slots.undelivered_count())
            timeout = None if wake_at is None else max(wake_at - now, _MIN_SLEEP)
            await event_or_timeout(self._events.wake, self._clock, timeout)

    def _launch_ready(self, now: float) -> float | None:
        """Start the best ready cards the budget allows; return when to look again (None: on a wake)."""
        if self.breaker.is_open:
            return self._launch_probe(now)
        self._queue.due(now)
        budget_at = self._budgets.soonest(self._apis, now)  # the soonest any card may get a budget
        if budget_at > now and self._queue and not (self.has_gate and self._queue.first_waiting()):
            # Every budget is spent: no card can start before budget_at (a pass stays O(1) meanwhile),
            # but behind a gate an urgent card is held only by the shared budget there.
            return None if math.isinf(budget_at) else budget_at
        spent: dict[str, float] = {}  # budgets found spent in this pass, and when they refill
        waiting: list[CardSlot] = []  # ready, but a budget it needs is spent
        earliest = math.inf
        while not self._apis <= spent.keys() and (slot := self._queue.pop()) is not None:
            if not slot.has_news:
                self._slots.let_go(slot)
                continue
            choices = slot.card.writer.choices(slot.card, urgent=slot.first)
            apis = self._take(slot, choices.apis, now, spent)
            if apis is not None:
                slot.launch(now, apis)
                self._flights.spawn(self._deliver(slot), name=f"fp-write-{slot.card.message_id}")
            else:  # it waits for that budget, or for another choice (a CardKit card's panels fall due)
                slot.waiting_apis = frozenset(api for apis in choices.apis for api in apis)
                waiting.append(slot)
                earliest = min(earliest, max(choices.changes_at, now + _MIN_SLEEP))
        for slot in waiting:  # their wake is the budget's refill (or their choice's change), not a time
            self._queue.put_ready(slot)
        earliest = min(earliest, self._queue.next_at(), *spent.values())
        wake_at = max(earliest, self._budgets.soonest(self._apis, now))
        return None if math.isinf(wake_at) else wake_at

    def _take(
        self, slot: CardSlot, choices: tuple[tuple[str, ...], ...], now: float, spent: dict[str, float]
    ) -> tuple[str, ...] | None:
        """The budgets of ``slot``'s first choice that has room, taken (None: it waits; ``spent`` learns
        which were full and when each frees).

        A card that owes the rest of an earlier state (a CardKit card whose text went alone, its panels
        owed) waits for its best choice, the write that brings all of it, when that budget frees within
        one of its intervals: another part alone would leave the rest owed again while a card that is
        owed nothing could have had that part's budget. The budget being spent for longer (its minute
        gone), it takes the next choice: the text never waits for the panels' budget.
        """
        take_first = self._budgets.take_first
        urgent, gated = slot.first, self.has_gate
        if len(choices) < 2 or not slot.owes_due(now):
            return take_first(choices, now, spent, urgent=urgent, behind_gate=gated)
        best = take_first(choices[:1], now, spent, urgent=urgent, behind_gate=gated)
        if best is not None:
            return best
        frees = max((spent.get(api, now) for api in choices[0]), default=now)
        if frees - now <= slot.card.writer.interval:
            return None
        return take_first(choices[1:], now, spent, urgent=urgent, behind_gate=gated)

    def _launch_probe(self, now: float) -> float | None:
        """Feishu is down for the whole app: one flight at a time, the most deserving card, as the probe."""
        if self.breaker.probing:
            return None  # its end wakes the dispatcher
        waiting = [s for s in self._slots if s.has_news and not s.in_flight]
        if not waiting:
            return None
        if self.breaker.next_probe > now:
            return self.breaker.next_probe
        slot = min(waiting, key=lambda s: s.priority())
        spent: dict[str, float] = {}
        apis = self._budgets.take_first(
            slot.card.writer.choices(slot.card, urgent=True).apis,
            now,
            spent,
            urgent=True,
            behind_gate=self.has_gate,
        )
        if apis is None:
            return min(spent.values())  # the soonest one of its choices has room
        self.breaker.probe_started(now)
        slot.probe = True
        self._queue.forget(slot)
        slot.launch(now, apis)
        self._flights.spawn(self._deliver(slot), name=f"fp-probe-{slot.card.message_id}")
        return None

    # -- one write --------------------------------------------------------------------------------

    async def _deliver(self, slot: CardSlot) -> None:
        try:
            outcome, delivery = await self._build_and_write(slot)
        except asyncio.CancelledError:
            self._flight_over(slot)  # ``stop`` cut it short: undelivered if the scheduler starts again
            if self._slots.holds(slot):
                self._queue.put(slot)
            raise
        finally:
            # Whatever happened (answered, failed, cancelled), a call made frees its budget slot one
            # window from now; a slot whose call was never made (the built card did not need it, or the
            # gate let nothing out) frees at once: nothing reached Feishu, so holding it for a window
            # would only keep other cards from a budget that has room.
            now = self._clock.monotonic()
            for api in slot.flight_apis:
                if api in slot.flight_sent:
                    self.budget_of(api).settle(now)
                else:
                    self.budget_of(api).release(now)
        now = self._clock.monotonic()
        if outcome.kind is OutcomeKind.NOT_NOW:  # this instance may not write now: the state waits
            self._flight_over(slot, retry_at=now + NOT_NOW_SECONDS)
        else:
            slot.in_flight = False
            self._end_probe(slot)
            if self.breaker.saw(
                transient=outcome.kind is OutcomeKind.BACKOFF, now=now, metrics=self._metrics
            ):
                self._outage_over(now)
            done = self._outcomes.settle(slot, delivery, outcome, now)
            if done is not None:
                self._done(slot, done)
        self._requeue(slot)

    async def _build_and_write(self, slot: CardSlot) -> tuple[WriteOutcome, Delivery | None]:
        card = slot.card
        try:
            delivery = await card.build_for_delivery(degraded=slot.degraded)
        except Exception as exc:
            # A builder bug must not lose the status: the degraded card is the way out.
            log.exception("building the card of message %s failed", card.message_id)
            return WriteOutcome(OutcomeKind.DEGRADE, reason=f"card build failed: {exc!r}"), None
        urgent = slot.flight_urgent or card.is_terminal
        try:
            calls = FlightCalls(slot, self._gate, urgent=urgent)
            return await card.writer.write(delivery, urgent=urgent, calls=calls), delivery
        except Exception as exc:
            # A writer promises to classify every failure; if it raises anyway, treat it as transient.
            log.exception("card writer raised for message %s", card.message_id)
            return WriteOutcome(OutcomeKind.BACKOFF, reason=f"writer raised: {exc!r}"), delivery

    def _flight_over(self, slot: CardSlot, retry_at: float | None = None) -> None:
        """The flight ended without an outcome to act on: its state waits, as it was."""
        self._end_probe(slot)
        slot.in_flight = False
        slot.restore_flight()
        if retry_at is not None:
            slot.next_start = retry_at

    def _end_probe(self, slot: CardSlot) -> None:
        if slot.probe:
            slot.probe = False
            self.breaker.probe_ended()

    def _requeue(self, slot: CardSlot) -> None:
        """After a flight: the card waits for its next write (or to be let go of), the dispatcher looks."""
        self._slots.written(slot)
        self._events.wake.set()
        self._events.progress.set()

    def _outage_over(self, now: float) -> None:
        """Every waiting card's newest state goes out at once (within the budget), its failures forgiven."""
        for slot in self._slots:
            slot.failures = 0
            if slot.has_news and not slot.in_flight:
                slot.next_start = min(slot.next_start, now)
                self._queue.put(slot)

    def _done(self, slot: CardSlot, done: Done) -> None:
        """Let go of a card for good (``done``): its final state delivered, or it can no longer be written."""
        if done.reason is not None:
            self._slots.remove(slot.card.message_id)
        self.ends.put_nowait(CardEnd(slot.card, done.reason))


__all__ = ["NOT_NOW_SECONDS", "CardEnd", "DeliveryScheduler", "FlushReport"]
