"""The delivery scheduler: decides when each live card may be written (one per process, shared by all cards).

Rules (docs/architecture.md, "Flow" step 3):
- exactly one write in flight per card; the newest state wins (a write carries the state at build time,
  changes during the flight cause one more write afterwards);
- at least ``message_interval`` between two PATCH starts of one message; a CardKit card (its text
  streams) is written every ``text_interval``, its panels at their own pace (``PARTIAL`` outcomes);
- every Open API its own app-wide budget (``BudgetTable``): a write takes the budget of each API it will
  call before it starts (a PATCH: the PATCH API's; a CardKit write: those its writer names from the
  card's versions, e.g. text by the element-content API's, panels by the card-update API's), retries
  included;
- under pressure: terminal states and urgent refreshes first, then the card that has waited longest;
- every ``PatchOutcome`` is acted on, nothing is retried forever, every give-up is logged.

A single dispatcher task sleeps until it is woken (a card changed, a PATCH ended) or until the next
eligible time; PATCHes run in a tracked task set. No per-card timers.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from feishu_progress.background import BackgroundTasks
from feishu_progress.backoff import backoff_delay
from feishu_progress.config import CardKitSettings, RateSettings
from feishu_progress.errors import FeishuProgressError
from feishu_progress.metrics import Metrics
from feishu_progress.ports import CardSink, Clock, OutcomeKind, PatchOutcome
from feishu_progress.progress.breaker import OutageBreaker
from feishu_progress.progress.card_stream import WRITE_APIS, CardStream, WriteChoices
from feishu_progress.progress.rate_budget import AppBudget, BudgetTable
from feishu_progress.waiting import event_or_timeout

log = logging.getLogger(__name__)

# Never spin: a wake time already due (or missed by a rounding error) still waits this long.
_MIN_SLEEP = 0.001
# An admission whose budget is all held by calls still out looks again this often (it used to sleep for
# ever: ``next_available`` is ``inf`` until a call ends, and nothing woke it).
_ADMIT_POLL = 0.05
# A card whose send the gate refused (no lease right now) is looked at again this much later.
NOT_NOW_SECONDS = 0.5
# A flight's grants are taken together: one older than this when the last arrives is taken again.
GRANT_FRESH_SECONDS = 0.05
GATE_ROUNDS = 4  # a flight of several APIs retakes stale grants at most this often, then goes
PATCH = "patch"  # the budget (and the cluster budget's API) of message PATCHes
_PATCH_CHOICES = WriteChoices(((PATCH,),))  # a PATCHed card's every write


class BudgetBusy(FeishuProgressError):
    """A call (not a card write) would wait for its API's budget past its bound."""

    def __init__(self, api: str, retry_after: int) -> None:
        super().__init__(f"the {api} budget is busy: try again in {retry_after} s")
        self.api = api
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Delivery:
    """One built card, and the state version and change time it was built from."""

    version: int
    changed_at: float
    card: Mapping[str, Any]
    panel_version: int = 0  # the version of everything but the answer text (CardKit paces them apart)
    streams: bool = False  # a CardKit card streams its text in this state (off while it waits or ended)
    text_version: int = 0  # the version of the answer text


class Deliverable(Protocol):
    """What the scheduler needs from a card (``LiveCard`` implements it)."""

    @property
    def message_id(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def panel_version(self) -> int: ...

    @property
    def text_version(self) -> int: ...

    @property
    def streams(self) -> bool: ...

    @property
    def is_terminal(self) -> bool: ...

    @property
    def stopped_reason(self) -> str | None: ...

    @property
    def stream(self) -> CardStream | None: ...

    async def build_for_delivery(self, *, degraded: bool = False) -> Delivery: ...

    def mark_stopped(self, reason: str) -> None: ...


class DeliveryGate(Protocol):
    """What a send must pass right before it goes out (cluster mode: the lease, the budget shared by all
    instances). ``enter`` answers a grant, or None when this instance may not write now."""

    async def enter(self, api: str, *, urgent: bool) -> object | None: ...

    def leave(self, grant: object) -> None: ...

    def paused(self, api: str, seconds: float) -> None: ...


class StreamWriter(Protocol):
    """Writes a built card to its CardKit card entity (feishu/cardkit_sink.py ``CardKitWriter``)."""

    def plan_write(
        self, stream: CardStream, *, panel_version: int, text_version: int, streams: bool, urgent: bool
    ) -> WriteChoices: ...

    async def write(
        self,
        stream: CardStream,
        card: Mapping[str, Any],
        *,
        panel_version: int,
        streams: bool,
        urgent: bool,
        text_version: int | None = None,
        allowed: Collection[str] | None = None,
    ) -> PatchOutcome: ...


class DeliveryListener(Protocol):
    """Who hears when a card is done with: its final state reached Feishu, or it can never be sent again."""

    def final_delivered(self, card: Deliverable) -> None: ...

    def card_stopped(self, card: Deliverable, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """Bounded exponential backoff with jitter; terminal states get more (still bounded) patience."""

    base_seconds: float = 0.5
    max_seconds: float = 30.0
    max_attempts: int = 8

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt counts from 1)."""
        return backoff_delay(attempt, self.base_seconds, self.max_seconds, rng)

    def attempts_for(self, terminal: bool) -> float:
        """How many failed attempts a state gets: a final state never gives up while the process lives."""
        return math.inf if terminal else self.max_attempts


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
class _Slot:
    """The scheduler's bookkeeping for one message."""

    card: Deliverable
    settled_version: int | None = None  # the newest version delivered or given up on
    in_flight: bool = False
    flight_version: int = 0
    urgent: bool = False
    flight_urgent: bool = False
    sending: bool = False  # the request itself is out (past the build and the gate)
    dropped: bool = False  # another instance writes the card now: a flight still under way sends nothing
    waiting_since: float | None = None  # oldest undelivered change outside the flight
    flight_waiting_since: float | None = None
    next_start: float = -math.inf
    failures: int = 0
    degraded: bool = False
    probe: bool = False  # this flight is the outage breaker's probe
    owed_at: float | None = None  # CardKit: the text went out, the rest of the card is due then
    flight_apis: tuple[str, ...] = ()  # the Open APIs whose budget this flight holds

    @property
    def has_news(self) -> bool:
        return self.card.version != self.settled_version or self.owed_at is not None

    def ready_at(self) -> float:
        """When this card (it has news) may be written next."""
        if self.card.version != self.settled_version or self.owed_at is None:
            return self.next_start
        return max(self.next_start, self.owed_at)  # only its panels wait: at their time

    def priority(self) -> tuple[int, float]:
        first = 0 if self.urgent or self.card.is_terminal else 1
        return first, self.waiting_since if self.waiting_since is not None else math.inf


@dataclass(slots=True)
class _Events:
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the dispatcher should look again
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # a PATCH ended (flush watches it)


class DeliveryScheduler:
    """Paces and budgets the PATCHes of every live card of the process."""

    def __init__(
        self,
        sink: CardSink,
        *,
        clock: Clock,
        rate: RateSettings | None = None,
        metrics: Metrics | None = None,
        backoff: BackoffPolicy | None = None,
        rng: random.Random | None = None,
        listener: DeliveryListener | None = None,
        default_pause_seconds: float = 1.0,
        breaker: OutageBreaker | None = None,
        gate: DeliveryGate | None = None,
        streams: StreamWriter | None = None,
        cardkit: CardKitSettings | None = None,
    ) -> None:
        rate = rate if rate is not None else RateSettings()
        cardkit = cardkit if cardkit is not None else CardKitSettings()
        self._sink = sink
        self._streams = streams
        self._clock = clock
        self._interval = rate.message_interval_ms / 1000.0  # a PATCHed message
        self._stream_interval = cardkit.text_interval_ms / 1000.0  # a CardKit card
        # Every Open API's own budget (FP_RATE__*), card writes and the calls that are not (a first
        # card's send or reply, a card entity's create) alike: a burst of new tasks must not meet
        # Feishu's limit either.
        self._table = BudgetTable(rate)
        self._queued: dict[str, int] = {}  # callers waiting in ``admit``, by API
        # The budgets some card has used: a pass can stop early only when each of these is spent (an
        # unused budget, e.g. CardKit's with FP_CARD__TRANSPORT=patch, must not make every pass a full scan).
        self._apis: set[str] = set()
        self._metrics = metrics if metrics is not None else Metrics()
        self._backoff = backoff if backoff is not None else BackoffPolicy()
        self._rng = rng if rng is not None else random.Random()
        self.listener = listener
        self._default_pause = default_pause_seconds
        self._slots: dict[str, _Slot] = {}
        self._flights = BackgroundTasks()
        self.breaker = breaker if breaker is not None else OutageBreaker()
        self.gate = gate
        self._events = _Events()
        self._dispatcher: asyncio.Task[None] | None = None

    # -- public API -------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._dispatcher is not None and not self._dispatcher.done()

    @property
    def budget(self) -> AppBudget:
        """The app-wide PATCH budget (read-only use: admin pages, tests)."""
        return self._budget_of(PATCH)

    def budget_of(self, api: str) -> AppBudget:
        """One Open API's app-wide budget (read-only use outside the scheduler: admin pages, tests)."""
        return self._table.get(api, self._clock.monotonic())

    _budget_of = budget_of

    def start(self) -> None:
        """Start the dispatcher task (inside a running event loop)."""
        if not self.running:
            self._dispatcher = asyncio.create_task(self._dispatch_forever(), name="fp-delivery-dispatcher")

    async def stop(self) -> None:
        """Stop dispatching and cancel PATCHes still in flight."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        await self._flights.cancel_all()

    async def stop_and_report(self, wait_seconds: float) -> set[str]:
        """Stop launching, give the requests out ``wait_seconds`` to end, cancel the rest: their ids.

        A hand-over (cluster mode) releases every other card at once; a cancelled request may still land
        at Feishu, so its card is left for the next writer to take as from a dead owner (it waits first).
        Flights still building or waiting for the budget are cancelled at once: nothing of theirs left.
        """
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        deadline = self._clock.monotonic() + wait_seconds
        while self._in_flight() and (remaining := deadline - self._clock.monotonic()) > 0:
            self._events.progress.clear()
            await event_or_timeout(self._events.progress, self._clock, remaining)
        still_flying = self._in_flight()
        await self._flights.cancel_all()
        return still_flying

    def _in_flight(self) -> set[str]:
        return {message_id for message_id, slot in self._slots.items() if slot.sending}

    @asynccontextmanager
    async def admit(self, api: str, *, max_wait: float | None = None) -> AsyncIterator[None]:
        """Make one call that is not a card write within ``api``'s app budget (and, in cluster mode, the
        budget every instance shares); waits for it. New tasks go ahead of card updates: urgent.

        ``max_wait``: never wait longer — ``BudgetBusy`` (with when to try again, from the budget's
        rate and the callers queued for it) at once when the queue cannot drain in time, or at the bound.
        """
        budget = self._budget_of(api)
        deadline = math.inf if max_wait is None else self._clock.monotonic() + max_wait
        self._queued[api] = self._queued.get(api, 0) + 1
        try:
            if max_wait is not None and self._queued[api] / budget.rate > max_wait:
                raise self._busy(api, budget)
            while not budget.try_take(now := self._clock.monotonic(), urgent=True):
                if now >= deadline:
                    raise self._busy(api, budget)
                # Every slot held by a call still out (``inf``): look again soon, a call's end frees one.
                wait = min(max(budget.next_available(now, urgent=True) - now, _MIN_SLEEP), _ADMIT_POLL)
                await self._clock.sleep(min(wait, max(deadline - now, _MIN_SLEEP)))
        finally:
            self._queued[api] -= 1
        try:
            grant = await self._admitted_by_gate(api, budget, deadline)
        except BaseException:
            budget.settle(self._clock.monotonic())
            raise
        try:
            yield
        finally:
            budget.settle(self._clock.monotonic())
            if self.gate is not None and grant is not None:
                self.gate.leave(grant)

    async def _admitted_by_gate(self, api: str, budget: AppBudget, deadline: float) -> object | None:
        # Without the lease (cluster mode) the gate refuses: the call goes ahead on the local budget alone.
        if self.gate is None:
            return None
        remaining = deadline - self._clock.monotonic()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, _MIN_SLEEP)):
                return await self.gate.enter(api, urgent=True)
        except TimeoutError:
            raise self._busy(api, budget) from None

    def _busy(self, api: str, budget: AppBudget) -> BudgetBusy:
        """Past the bound: try again when the callers queued now have had their turn."""
        retry_after = max(1, math.ceil((self._queued.get(api, 0) + 1) / budget.rate))
        return BudgetBusy(api, retry_after)

    def notify(self, card: Deliverable, *, urgent: bool = False) -> None:
        """Note that ``card`` has a newer state; ``urgent`` puts it ahead of ordinary updates."""
        if card.stopped_reason is not None:
            return
        slot = self._slots.get(card.message_id)
        if slot is None:
            slot = self._slots[card.message_id] = self._new_slot(card)
        slot.card = card
        self._apis.update(self._write_apis(card))  # the card may have been re-attached with another transport
        newly_pending = slot.waiting_since is None
        if newly_pending:
            slot.waiting_since = self._clock.monotonic()
        newly_urgent = urgent and not slot.urgent
        slot.urgent = slot.urgent or urgent
        # An in-flight or already-scheduled card is looked at again when its PATCH ends or its time comes.
        if (newly_pending or newly_urgent) and not slot.in_flight:
            self._events.wake.set()

    def _new_slot(self, card: Deliverable) -> _Slot:
        slot = _Slot(card)
        self._apis.update(self._write_apis(card))
        return slot

    def _write_apis(self, card: Deliverable) -> tuple[str, ...]:
        """The APIs a card's writes spend (a pass may stop early only when each of these is spent)."""
        return (PATCH,) if card.stream is None or self._streams is None else WRITE_APIS

    def _choices(self, slot: _Slot) -> WriteChoices:
        """The Open APIs the card's next write may call, best first, decided before it takes budgets."""
        card = slot.card
        if card.stream is None or self._streams is None:
            return _PATCH_CHOICES
        return self._streams.plan_write(
            card.stream,
            panel_version=card.panel_version,
            text_version=card.text_version,
            streams=card.streams,
            urgent=slot.urgent or card.is_terminal,
        )

    def _budgeted(
        self, choices: tuple[tuple[str, ...], ...], now: float, spent: dict[str, float], *, urgent: bool
    ) -> tuple[str, ...] | None:
        """The first choice whose budgets all had room, now taken (None: none; ``spent`` learns why)."""
        for apis in choices:
            if any(api in spent for api in apis):
                continue
            blocked = self._take(apis, now, urgent=urgent)  # terminal or urgent first
            if not blocked:
                return apis
            # More are ready: the budget decides when the best of them may go.
            spent.update(blocked)
        return None

    def _take(self, apis: tuple[str, ...], now: float, *, urgent: bool) -> dict[str, float]:
        """Take one slot of each API's budget, all or none: {} when taken, else when each full one frees."""
        blocked = {
            api: at for api in apis if (at := self._budget_of(api).next_available(now, urgent=urgent)) > now
        }
        if not blocked:
            for api in apis:
                self._budget_of(api).try_take(now, urgent=urgent)
        return blocked

    def hold(self, card: Deliverable, seconds: float) -> None:
        """Send nothing of ``card`` for ``seconds`` (a card taken from a dead instance: its last write may
        still be in flight), then its newest state."""
        slot = self._slots.get(card.message_id)
        if slot is None:
            slot = self._slots[card.message_id] = self._new_slot(card)
        slot.next_start = max(slot.next_start, self._clock.monotonic() + seconds)

    def drop(self, message_id: str) -> None:
        """Forget a card this instance no longer writes (taken by another instance); a flight that has
        not sent yet sends nothing."""
        slot = self._slots.pop(message_id, None)
        if slot is not None:
            slot.dropped = True

    def pending_message_ids(self) -> list[str]:
        """Messages with a state not yet delivered (in flight or waiting)."""
        return [mid for mid, slot in self._slots.items() if slot.in_flight or slot.has_news]

    async def flush(self, deadline_s: float) -> FlushReport:
        """Deliver what is pending (terminal states first) within ``deadline_s`` seconds, then stop."""
        self.start()
        deadline = self._clock.monotonic() + deadline_s
        while self.pending_message_ids():
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                break
            self._events.progress.clear()
            await event_or_timeout(self._events.progress, self._clock, remaining)
        report = self._flush_report()
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
                wake_at = now + self._interval
            timeout = None if wake_at is None else max(wake_at - now, _MIN_SLEEP)
            await event_or_timeout(self._events.wake, self._clock, timeout)

    def _launch_ready(self, now: float) -> float | None:
        """Start the best ready cards the budget allows; return when to look again (None: on a wake)."""
        if self.breaker.is_open:
            return self._launch_probe(now)
        budget_at = self._budget_at(now)  # the soonest any card may get a budget
        if budget_at > now and self._slots:
            # Every budget is spent: no card can start before budget_at, so there is no point looking at
            # every card now. This keeps a pass O(1) while thousands of cards wait their turn.
            return None if math.isinf(budget_at) else budget_at
        ready, earliest = self._ready(now)
        spent: dict[str, float] = {}  # budgets found spent in this pass, and when they refill
        while ready and not self._apis <= spent.keys():
            priority, _, slot = heapq.heappop(ready)
            choices = self._choices(slot)
            apis = self._budgeted(choices.apis, now, spent, urgent=priority[0] == 0)
            if apis is not None:
                self._launch(slot, now, apis)
            else:  # a budget it needs is spent: it waits for it, or for another choice (panels due)
                earliest = min(earliest, max(choices.changes_at, now + _MIN_SLEEP))
        earliest = min(earliest, *spent.values()) if spent else earliest
        if math.isinf(earliest):
            return None
        wake_at = max(earliest, self._budget_at(now))
        return None if math.isinf(wake_at) else wake_at

    def _budget_at(self, now: float) -> float:
        """The soonest any budget a card uses has room (each of them spent: nothing can start before)."""
        return min((self._budget_of(api).next_available(now, urgent=True) for api in self._apis), default=now)

    def _ready(self, now: float) -> tuple[list[tuple[tuple[int, float], int, _Slot]], float]:
        """The cards that may be written now, as a heap (best first), and when the next other one may."""
        ready: list[tuple[tuple[int, float], int, _Slot]] = []
        pending = 0
        earliest = math.inf  # the soonest a waiting (not yet ready) card may start
        for message_id, slot in list(self._slots.items()):
            if slot.in_flight:
                pending += 1
            elif slot.has_news:
                pending += 1
                ready_at = slot.ready_at()
                if ready_at <= now:
                    ready.append((slot.priority(), len(ready), slot))
                else:
                    earliest = min(earliest, ready_at)
            elif slot.card.is_terminal and slot.next_start <= now:
                del self._slots[message_id]  # done for good; keeping it past next_start adds nothing
        self._metrics.pending_cards.set(pending)
        heapq.heapify(ready)  # O(n); only as many pops as the budget allows launches
        return ready, earliest

    def _launch_probe(self, now: float) -> float | None:
        """Feishu is down for the whole app: one flight at a time, the most deserving card, as the probe."""
        if self.breaker.probing:
            return None  # its end wakes the dispatcher
        waiting = [s for s in self._slots.values() if s.has_news and not s.in_flight]
        if not waiting:
            return None
        slot = min(waiting, key=lambda s: s.priority())
        if self.breaker.next_probe > now:
            return self.breaker.next_probe
        spent: dict[str, float] = {}
        apis = self._budgeted(self._choices(slot).apis, now, spent, urgent=True)
        if apis is None:
            return min(spent.values())  # the soonest one of its choices has room
        self.breaker.probe_started(now)
        slot.probe = True
        self._launch(slot, now, apis)
        return None

    def _launch(self, slot: _Slot, now: float, apis: tuple[str, ...]) -> None:
        slot.in_flight = True
        slot.flight_version = slot.card.version
        slot.flight_apis = apis
        slot.next_start = now + (self._interval if slot.card.stream is None else self._stream_interval)
        slot.flight_urgent, slot.urgent = slot.urgent, False
        slot.flight_waiting_since, slot.waiting_since = slot.waiting_since, None
        self._flights.spawn(self._deliver(slot), name=f"fp-patch-{slot.card.message_id}")

    # -- one PATCH --------------------------------------------------------------------------------

    async def _deliver(self, slot: _Slot) -> None:
        try:
            await self._deliver_once(slot)
        finally:
            # Whatever happened (answered, failed, cancelled), the budget slots free one window from now.
            for api in slot.flight_apis:
                self._budget_of(api).settle(self._clock.monotonic())

    def _not_now(self, slot: _Slot) -> None:
        if slot.probe:
            slot.probe = False
            self.breaker.probe_ended()
        slot.in_flight = False
        self._restore_flight(slot)
        slot.next_start = self._clock.monotonic() + NOT_NOW_SECONDS
        self._events.wake.set()
        self._events.progress.set()

    async def _deliver_once(self, slot: _Slot) -> None:
        delivery: Delivery | None = None
        try:
            delivery = await slot.card.build_for_delivery(degraded=slot.degraded)
        except asyncio.CancelledError:
            self._cancelled(slot)
            raise
        except Exception as exc:
            # A builder bug must not lose the status: the degraded card is the way out.
            log.exception(
                "building the card of message %s failed",
                slot.card.message_id,
                extra={"message_id": slot.card.message_id},
            )
            outcome = PatchOutcome(OutcomeKind.DEGRADE, reason=f"card build failed: {exc!r}")
        else:
            try:
                gated = await self._gated_write(slot, delivery)
            except asyncio.CancelledError:
                self._cancelled(slot)
                raise
            if gated is None:  # this instance may not write now (no lease): the state waits
                self._not_now(slot)
                return
            outcome = gated
        slot.in_flight = False
        now = self._clock.monotonic()
        self._breaker_sees(slot, outcome, now)
        self._handle(slot, delivery, outcome, now)
        self._events.wake.set()
        self._events.progress.set()

    def _breaker_sees(self, slot: _Slot, outcome: PatchOutcome, now: float) -> None:
        if slot.probe:
            slot.probe = False
            self.breaker.probe_ended()
        if outcome.kind is not OutcomeKind.BACKOFF:
            if self.breaker.answered():
                self._outage_over(now)
        elif self.breaker.failure(now):
            log.error(
                "Feishu is failing for every card: outage breaker open, probing every %.0f s",
                self.breaker.probe_interval,
            )
            self._metrics.breaker_open.set(1)
            self._metrics.breaker_transitions.labels(to="open").inc()

    def _outage_over(self, now: float) -> None:
        """Every waiting card's newest state goes out at once (within the budget), its failures forgiven."""
        log.warning("Feishu answers again: outage breaker closed, sending every waiting card")
        self._metrics.breaker_open.set(0)
        self._metrics.breaker_transitions.labels(to="closed").inc()
        for slot in self._slots.values():
            slot.failures = 0
            if slot.has_news:
                slot.next_start = min(slot.next_start, now)

    def _cancelled(self, slot: _Slot) -> None:
        """``stop`` cut the flight short: its state counts as undelivered if the scheduler starts again."""
        if slot.probe:
            slot.probe = False
            self.breaker.probe_ended()
        slot.in_flight = False
        self._restore_flight(slot)

    async def _gated_write(self, slot: _Slot, delivery: Delivery) -> PatchOutcome | None:
        """The write, through the gate when there is one (None: the gate said not now).

        The gate is passed after the card is built, right before the request: a shared budget counts
        a grant as arriving at Feishu within a few tens of milliseconds, which a build (it may wait
        for the subagent query) would not keep.
        """
        grants = await self._enter_gate(slot)
        if grants is None:
            return None
        try:
            if slot.dropped:  # taken by another instance while this flight waited
                return None
            slot.sending = True
            try:
                return await self._write(slot, delivery)
            finally:
                slot.sending = False
        finally:
            for grant in grants:
                self._leave_gate(grant)

    async def _enter_gate(self, slot: _Slot) -> list[object] | None:
        """One grant of the gate per API the flight holds (None: not now; nothing is kept then).

        A shared budget counts a grant as reaching Feishu within ``GRANT_FRESH_SECONDS``. When a later
        API of the flight made it wait longer than that, the earlier grants are stale (their request would
        arrive late, where the windows no longer hold room for it): they are taken again, which costs
        budget but never lets a request arrive outside its window.
        """
        if self.gate is None:
            return []
        urgent = slot.flight_urgent or slot.card.is_terminal
        held: dict[str, tuple[object, float]] = {}
        for round_ in range(GATE_ROUNDS):
            for api in slot.flight_apis:
                if api in held:
                    continue
                grant = await self.gate.enter(api, urgent=urgent)
                if grant is None:
                    for stale, _at in held.values():
                        self.gate.leave(stale)
                    return None
                held[api] = (grant, self._clock.monotonic())
            now = self._clock.monotonic()
            stale_apis = [api for api, (_, at) in held.items() if now - at > GRANT_FRESH_SECONDS]
            if not stale_apis or round_ == GATE_ROUNDS - 1:
                break
            for api in stale_apis:
                self.gate.leave(held.pop(api)[0])
        return [grant for grant, _ in held.values()]

    def _leave_gate(self, grant: object) -> None:
        if self.gate is not None:
            self.gate.leave(grant)

    async def _write(self, slot: _Slot, delivery: Delivery) -> PatchOutcome:
        message_id, stream = slot.card.message_id, slot.card.stream
        try:
            if stream is None or self._streams is None:
                return await self._sink.patch_card(message_id, delivery.card)
            return await self._streams.write(
                stream,
                delivery.card,
                panel_version=delivery.panel_version,
                streams=delivery.streams,
                urgent=slot.flight_urgent or slot.card.is_terminal,
                text_version=delivery.text_version,
                allowed=slot.flight_apis,  # a call whose budget the flight does not hold waits
            )
        except Exception as exc:
            # The sink promises to classify every failure; if it raises anyway, treat it as transient.
            log.exception("card sink raised for message %s", message_id, extra={"message_id": message_id})
            return PatchOutcome(OutcomeKind.BACKOFF, reason=f"sink raised: {exc!r}")

    def _handle(self, slot: _Slot, delivery: Delivery | None, outcome: PatchOutcome, now: float) -> None:
        self._metrics.patches.labels(outcome=outcome.kind.value).inc()
        kind = outcome.kind
        if kind is OutcomeKind.DELIVERED:
            if delivery is not None:  # always: DELIVERED only follows a successful build
                self._delivered(slot, delivery, now)
        elif kind is OutcomeKind.PARTIAL:
            if delivery is not None:
                self._delivered(slot, delivery, now, owed_at=now + outcome.retry_after)
        elif kind is OutcomeKind.RETRY_MESSAGE:
            self._metrics.rate_limit_hits.labels(kind="message").inc()
            self._retry(slot, outcome, max(outcome.retry_after, self._interval), now)
        elif kind is OutcomeKind.PAUSE_APP:
            self._metrics.rate_limit_hits.labels(kind="app").inc()
            pause = outcome.retry_after if outcome.retry_after > 0 else self._default_pause
            for api in slot.flight_apis:  # which of its calls was refused is not told: all of them
                self._budget_of(api).pause_until(now + pause)
                if self.gate is not None:
                    self.gate.paused(api, pause)
            log.warning("app rate limit hit (code %s): pausing every card for %.2fs", outcome.code, pause)
            self._retry(slot, outcome, pause, now)
        elif kind is OutcomeKind.BACKOFF and self.breaker.is_open:
            self._restore_flight(slot)  # it waits for the breaker; an outage costs no attempt
        elif kind is OutcomeKind.BACKOFF:
            self._retry(slot, outcome, self._backoff.delay(slot.failures + 1, self._rng), now)
        elif kind is OutcomeKind.STOP:
            self._stop(slot, outcome.reason or f"message can no longer be updated (code {outcome.code})")
        elif kind is OutcomeKind.DEGRADE:
            self._degrade(slot, outcome)

    def _delivered(self, slot: _Slot, delivery: Delivery, now: float, owed_at: float | None = None) -> None:
        slot.settled_version = delivery.version
        slot.owed_at = owed_at
        slot.failures = 0
        self._metrics.delivery_staleness.observe(max(0.0, now - delivery.changed_at))
        if not slot.has_news:
            slot.waiting_since = None
            if slot.card.is_terminal and self.listener is not None:
                self._tell(self.listener.final_delivered, slot.card)

    def _tell(self, hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("delivery listener failed")

    def _restore_flight(self, slot: _Slot) -> None:
        """The flight failed: its state is still undelivered, as old and as urgent as it was."""
        slot.urgent = slot.urgent or slot.flight_urgent
        if slot.flight_waiting_since is not None:
            slot.waiting_since = min(slot.flight_waiting_since, slot.waiting_since or math.inf)

    def _retry(self, slot: _Slot, outcome: PatchOutcome, delay: float, now: float) -> None:
        slot.failures += 1
        limit = self._backoff.attempts_for(slot.card.is_terminal)
        if slot.failures >= limit:
            self._give_up(slot, outcome, limit)
            return
        self._restore_flight(slot)
        slot.next_start = max(slot.next_start, now + delay)

    def _give_up(self, slot: _Slot, outcome: PatchOutcome, attempts: float) -> None:
        message_id = slot.card.message_id
        level = logging.ERROR if slot.card.is_terminal else logging.WARNING
        log.log(
            level,
            "giving up on version %d of message %s after %.0f attempts: %s %s",
            slot.flight_version,
            message_id,
            attempts,
            outcome.kind.value,
            outcome.reason,
            extra={"message_id": message_id, "code": outcome.code},
        )
        self._metrics.delivery_give_ups.labels(reason="attempts_exhausted").inc()
        slot.settled_version = slot.flight_version
        slot.failures = 0
        if slot.has_news:  # a newer state arrived meanwhile: it gets its own fresh attempts
            self._restore_flight(slot)
        else:
            slot.waiting_since = None

    def _degrade(self, slot: _Slot, outcome: PatchOutcome) -> None:
        if slot.degraded:
            self._stop(slot, f"degraded card rejected too: {outcome.reason or outcome.code}")
            return
        log.warning(
            "card of message %s rejected (%s %s): resending a degraded card",
            slot.card.message_id,
            outcome.code,
            outcome.reason,
            extra={"message_id": slot.card.message_id},
        )
        # Sticky: the full card would be rejected again, and a card must not pay two PATCHes per state.
        slot.degraded = True
        self._restore_flight(slot)

    def _stop(self, slot: _Slot, reason: str) -> None:
        message_id = slot.card.message_id
        log.warning("stopped updating message %s: %s", message_id, reason, extra={"message_id": message_id})
        self._metrics.delivery_give_ups.labels(reason="stopped").inc()
        self._slots.pop(message_id, None)
        slot.card.mark_stopped(reason)
        if self.listener is not None:
            self._tell(self.listener.card_stopped, slot.card, reason)

    def _flush_report(self) -> FlushReport:
        terminal: list[str] = []
        other: list[str] = []
        for message_id in self.pending_message_ids():
            (terminal if self._slots[message_id].card.is_terminal else other).append(message_id)
        return FlushReport(tuple(terminal), tuple(other))
