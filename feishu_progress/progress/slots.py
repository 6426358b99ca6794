"""A card's place in the delivery scheduler: its slot, the ready queue, and its flight's way out.

The ready queue is why a dispatcher pass costs O(cards ready), not O(all cards): a card with a state
not yet written waits in a heap by the time it may go (its pacing interval, a retry's backoff, a
follow-up's due time); at a pass the cards whose time has come move to a heap by who goes first
(terminal states and urgent ones, then the card that has waited longest), and the pass pops as many as
the budgets allow. A card that has nothing new is in neither heap, so ten thousand idle cards cost a
pass nothing. Entries are never removed from a heap: a card queued again gets a new token, and an entry
whose token is no longer its card's is skipped when it comes up (lazy deletion).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from feishu_progress.progress.writer import CardVersions, CardWriter, Delivery, DeliveryGate

# A heap holding this many times more entries than live ones (plus this floor) is rebuilt.
_COMPACT_FACTOR = 4
_COMPACT_FLOOR = 1024


class Deliverable(CardVersions, Protocol):
    """What the scheduler needs from a card (``LiveCard`` implements it)."""

    @property
    def message_id(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def is_terminal(self) -> bool: ...

    @property
    def stopped_reason(self) -> str | None: ...

    @property
    def writer(self) -> CardWriter: ...

    async def build_for_delivery(self, *, degraded: bool = False) -> Delivery: ...

    def mark_stopped(self, reason: str) -> None: ...


@dataclass(slots=True)
class CardSlot:
    """The scheduler's bookkeeping for one card."""

    card: Deliverable
    settled_version: int | None = None  # the newest version delivered or given up on
    in_flight: bool = False
    flight_version: int = 0
    urgent: bool = False
    flight_urgent: bool = False
    sending: bool = False  # a request of the flight is out (past the build and the gate)
    dropped: bool = False  # another instance writes the card now: a flight under way sends nothing more
    waiting_since: float | None = None  # oldest undelivered change outside the flight
    flight_waiting_since: float | None = None
    next_start: float = -math.inf
    failures: int = 0
    degraded: bool = False
    probe: bool = False  # this flight is the outage breaker's probe
    follow_up_at: float | None = None  # the writer owes more of the card (CardKit panels) from then
    flight_apis: tuple[str, ...] = ()  # the Open APIs whose budget this flight holds
    # Waiting for a budget: the Open APIs its choices named then (a change can only offer another).
    waiting_apis: frozenset[str] = frozenset()
    flight_sent: set[str] = field(default_factory=set)  # those of them the flight has called
    token: int = 0  # its live ready-queue entry (0: not queued)
    queued_at: float = math.inf  # when that entry lets it go
    queued_priority: tuple[int, float] = (1, math.inf)  # its place in line as that entry has it

    @property
    def has_news(self) -> bool:
        return self.card.version != self.settled_version or self.follow_up_at is not None

    @property
    def first(self) -> bool:
        """Ahead of ordinary updates: a terminal state, or an urgent one (a click's change, a takeover)."""
        return self.urgent or self.card.is_terminal

    def ready_at(self) -> float:
        """When this card may be written next (or, with nothing new, let go of)."""
        if self.card.version != self.settled_version or self.follow_up_at is None:
            return self.next_start
        return max(self.next_start, self.follow_up_at)  # only what the writer owes: at its time

    def owes_due(self, now: float) -> bool:
        """Whether the writer owes part of an earlier state, due by ``now`` (the rest of a CardKit card
        after a write that carried its text alone)."""
        return self.follow_up_at is not None and self.follow_up_at <= now

    def priority(self) -> tuple[int, float]:
        return 0 if self.first else 1, self.waiting_since if self.waiting_since is not None else math.inf

    def launch(self, now: float, apis: tuple[str, ...]) -> None:
        """A flight starts with the budgets of ``apis``: what was waiting is now the flight's."""
        self.in_flight = True
        self.flight_version = self.card.version
        self.flight_apis = apis
        self.flight_sent = set()
        self.waiting_apis = frozenset()  # no longer waiting: its next wait names its own
        self.next_start = now + self.card.writer.interval
        self.flight_urgent, self.urgent = self.urgent, False
        self.flight_waiting_since, self.waiting_since = self.waiting_since, None

    def restore_flight(self) -> None:
        """The flight did not deliver: its state is still undelivered, as old and as urgent as it was."""
        self.urgent = self.urgent or self.flight_urgent
        if self.flight_waiting_since is not None:
            self.waiting_since = min(self.flight_waiting_since, self.waiting_since or math.inf)


class ReadyQueue:
    """Cards with something to write, by when they may go and then by who goes first."""

    def __init__(self) -> None:
        self._later: list[tuple[float, int, CardSlot]] = []  # by ready_at
        self._now: list[tuple[tuple[int, float], int, CardSlot]] = []  # by priority, time has come
        self._tokens = itertools.count(1)
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def put(self, slot: CardSlot) -> None:
        """Queue ``slot`` (again) at its ``ready_at``; an earlier entry of it stops counting."""
        if slot.token == 0:
            self._live += 1
        slot.token, slot.queued_at = next(self._tokens), slot.ready_at()
        slot.queued_priority = slot.priority()
        heapq.heappush(self._later, (slot.queued_at, slot.token, slot))
        if len(self._later) + len(self._now) > _COMPACT_FACTOR * self._live + _COMPACT_FLOOR:
            self._compact()

    def put_ready(self, slot: CardSlot) -> None:
        """Queue ``slot`` among the cards whose time has come (it waits for a budget, not for a time)."""
        if slot.token == 0:
            self._live += 1
        slot.token, slot.queued_at, slot.queued_priority = next(self._tokens), -math.inf, slot.priority()
        heapq.heappush(self._now, (slot.queued_priority, slot.token, slot))

    def needs_put(self, slot: CardSlot) -> bool:
        """Whether ``slot``'s entry (if any) no longer says when it may go or its place in line: an entry
        among the cards whose time has come keeps the priority it was pushed with, so a card that became
        urgent, or whose first change arrived after it was queued, must be pushed again or it would wait
        behind every card that changed since."""
        return slot.token == 0 or slot.ready_at() < slot.queued_at or slot.priority() < slot.queued_priority

    def forget(self, slot: CardSlot) -> None:
        if slot.token != 0:
            slot.token, slot.queued_at = 0, math.inf
            self._live -= 1

    def due(self, now: float) -> None:
        """Move every card whose time has come to the heap of who goes first."""
        later = self._later
        while later and later[0][0] <= now:
            _, token, slot = heapq.heappop(later)
            if token == slot.token:
                slot.queued_priority = slot.priority()
                heapq.heappush(self._now, (slot.queued_priority, token, slot))

    def first_waiting(self) -> bool:
        """Whether the best card whose time has come goes ahead of ordinary updates."""
        ready = self._now
        while ready and ready[0][1] != ready[0][2].token:
            heapq.heappop(ready)
        return bool(ready) and ready[0][0][0] == 0

    def pop(self) -> CardSlot | None:
        """The best card whose time has come (no longer queued), or None."""
        while self._now:
            _, token, slot = heapq.heappop(self._now)
            if token == slot.token:
                self.forget(slot)
                return slot
        return None

    def next_at(self) -> float:
        """When the next card waiting for its time may go (``inf``: none)."""
        later = self._later
        while later and later[0][1] != later[0][2].token:
            heapq.heappop(later)
        return later[0][0] if later else math.inf

    def _compact(self) -> None:
        self._later = [entry for entry in self._later if entry[1] == entry[2].token]
        self._now = [entry for entry in self._now if entry[1] == entry[2].token]
        heapq.heapify(self._later)
        heapq.heapify(self._now)


class CardSlots:
    """Every card the scheduler knows, the ready queue of those with something to write, and which
    have a state not yet delivered."""

    def __init__(self) -> None:
        self._by_message: dict[str, CardSlot] = {}
        self.queue = ReadyQueue()
        self._undelivered: set[str] = set()  # message ids with a state in flight or waiting

    def __iter__(self) -> Iterator[CardSlot]:
        return iter(self._by_message.values())

    def slot(self, card: Deliverable) -> CardSlot:
        """``card``'s slot (a new one the first time)."""
        slot = self._by_message.get(card.message_id)
        if slot is None:
            slot = self._by_message[card.message_id] = CardSlot(card)
        return slot

    def holds(self, slot: CardSlot) -> bool:
        return self._by_message.get(slot.card.message_id) is slot

    def changed(self, card: Deliverable, *, urgent: bool, now: float) -> bool:
        """``card`` has a newer state: True when it was queued (again) for it (the dispatcher should look)."""
        slot = self.slot(card)
        slot.card = card  # the card may have been re-attached (a new live card, maybe another writer)
        if slot.waiting_since is None:
            slot.waiting_since = now
        slot.urgent = slot.urgent or urgent
        self._undelivered.add(card.message_id)
        # A card in flight is looked at again when its write ends.
        if slot.in_flight:
            return False
        if self.queue.needs_put(slot):
            self.queue.put(slot)
            return True
        # Waiting for a budget: when its choices left out an API of its writer, the change may give it
        # that choice (new text for a CardKit card whose panels wait for theirs). One whose choices
        # named them all already waits for whichever frees first: looking again would find the same.
        apis = card.writer.apis
        return slot.queued_at == -math.inf and len(apis) > 1 and not slot.waiting_apis.issuperset(apis)

    def written(self, slot: CardSlot) -> None:
        """After a flight: the card waits for its next write, or (a finished one) to be let go of."""
        if not self.holds(slot):
            return  # stopped, or dropped meanwhile
        if not slot.has_news:
            self._undelivered.discard(slot.card.message_id)
        if slot.has_news or slot.card.is_terminal:
            self.queue.put(slot)

    def let_go(self, slot: CardSlot) -> None:
        """A card with nothing new whose time came: a finished one is forgotten (its pacing kept so far)."""
        if slot.card.is_terminal and not slot.in_flight and self.holds(slot):
            del self._by_message[slot.card.message_id]

    def remove(self, message_id: str) -> CardSlot | None:
        """Forget a card for good (stopped, or written by another instance now)."""
        slot = self._by_message.pop(message_id, None)
        self._undelivered.discard(message_id)
        if slot is not None:
            self.queue.forget(slot)
        return slot

    def undelivered(self) -> list[CardSlot]:
        """Cards with a state not yet delivered (in flight or waiting)."""
        return [slot for message_id in self._undelivered if (slot := self._by_message.get(message_id))]

    def undelivered_count(self) -> int:
        return len(self._undelivered)

    def sending(self) -> set[str]:
        """Cards with a request out now."""
        return {message_id for message_id, slot in self._by_message.items() if slot.sending}


class FlightCalls:
    """One flight's way out (``writer.Calls``): the budgets it took, and the gate before each request.

    The gate (cluster mode: the lease and the shared budget) is passed right before each request, not
    once per flight: a shared grant counts as arriving at Feishu within tens of milliseconds, which a
    CardKit write's later calls would not keep if every grant were taken before the first.
    """

    __slots__ = ("_gate", "_slot", "_urgent")

    def __init__(self, slot: CardSlot, gate: DeliveryGate | None, *, urgent: bool) -> None:
        self._slot = slot
        self._gate = gate
        self._urgent = urgent

    def allows(self, api: str) -> bool:
        return api in self._slot.flight_apis

    @contextlib.asynccontextmanager
    async def call(self, api: str) -> AsyncIterator[bool]:
        slot, gate = self._slot, self._gate
        grant = None if gate is None or slot.dropped else await gate.enter(api, urgent=self._urgent)
        if slot.dropped or (gate is not None and grant is None):
            if gate is not None and grant is not None:
                gate.leave(grant)
            yield False  # taken by another instance meanwhile, or no lease now: nothing is sent
            return
        slot.sending = True
        slot.flight_sent.add(api)
        try:
            yield True
        finally:
            slot.sending = False
            if gate is not None and grant is not None:
                gate.leave(grant)
