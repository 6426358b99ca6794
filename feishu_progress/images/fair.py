"""Slots shared fairly between owners (tasks), so one owner's slow work cannot queue everyone else's.

Issue 26: 18 image URLs of one task that never answered held every image slot in turn, and another
task's local image waited 39 s behind them. ``FairSlots`` gives each owner at most ``per_owner`` slots
at once, and a slot that frees goes to the waiting owner that holds the fewest (the earliest waiter
among equals), so a newcomer is served before an owner that already holds slots queues more.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class SlotLease:
    """One held slot; ``release()`` gives it back early (once), leaving ``FairSlots.hold`` does too."""

    def __init__(self, slots: FairSlots, owner: Hashable) -> None:
        self._slots = slots
        self._owner = owner
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self._owner)


class FairSlots:
    """``capacity`` slots; at most ``per_owner`` to one owner; a free slot to the owner holding fewest."""

    def __init__(self, capacity: int, per_owner: int) -> None:
        self.capacity = capacity
        self.per_owner = max(1, min(per_owner, capacity))
        self._free = capacity
        self._held: Counter[Hashable] = Counter()
        self._waiting: list[tuple[Hashable, asyncio.Future[None]]] = []  # first come first

    def held_by(self, owner: Hashable) -> int:
        return self._held[owner]

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def hold(self, owner: Hashable) -> AsyncIterator[SlotLease]:
        """Wait for a slot for ``owner`` and hold it for the block (or until the lease is released)."""
        await self._acquire(owner)
        lease = SlotLease(self, owner)
        try:
            yield lease
        finally:
            lease.release()

    async def _acquire(self, owner: Hashable) -> None:
        entry = (owner, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        self._dispatch()
        try:
            await entry[1]
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            else:
                self._give_back(owner)  # granted, but its taker was cancelled before it resumed
            raise

    def _give_back(self, owner: Hashable) -> None:
        self._held[owner] -= 1
        if self._held[owner] <= 0:
            del self._held[owner]
        self._free += 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free > 0:
            entry = self._next_waiter()
            if entry is None:
                return
            self._waiting.remove(entry)
            self._free -= 1
            self._held[entry[0]] += 1
            entry[1].set_result(None)

    def _next_waiter(self) -> tuple[Hashable, asyncio.Future[None]] | None:
        best: tuple[Hashable, asyncio.Future[None]] | None = None
        for entry in self._waiting:  # at most a few hundred: each task's images are capped
            held = self._held[entry[0]]
            if entry[1].done():
                continue  # cancelled: its taker removes it when it resumes
            if held < self.per_owner and (best is None or held < self._held[best[0]]):
                best = entry
        return best
