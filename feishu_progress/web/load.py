"""Load isolation for the runtime API: a few large bodies at a time, so a flood of them cannot starve
card clicks (issue 26: 30 concurrent 8 MB batches pushed clicks past Feishu's 3 s).

Everything done for a large body — reading it, parsing, validating, applying — runs on the event loop in
stretches of tens of milliseconds that nothing else can interrupt. Thirty of them interleaved put a
click's every step behind thirty such stretches; ``HeavyGate`` lets ``concurrency`` large bodies in at a
time (others wait their turn, or get 429 with ``Retry-After`` past ``max_wait``), so a click waits for at
most one stretch, and the bytes held in memory are bounded too. Small bodies (most batches: a few
deltas) never wait.

A click goes first: while one is being answered (``urgent``), a large body in progress waits at its
next step (``give_way``) instead of starting another stretch. A click's own path suspends several
times (its action is written to the database before the toast goes back), and at each of those a
stretch of the flood's got in: the click waited for several stretches, not one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from aiohttp import web

from feishu_progress.web.http import HttpError

LARGE_BODY_BYTES = 256 * 1024
# A large body waits at most this long per step for clicks being answered: a stream of clicks slows a
# flood of large bodies down, it never stops one.
GIVE_WAY_SECONDS = 0.5


# How long the event batches may hold the loop in one of its turns (its iterations); see ``LoopShare``.
BATCH_SLICE_SECONDS = 0.01
# How fast the estimate of one batch's share of a turn follows the turns just measured.
_COST_WEIGHT = 0.5


class LoopShare:
    """Event batches take turns of the event loop: in one turn (one iteration) they start only while the
    turn is younger than ``slice_seconds``; later ones wait, in order, for the next turns.

    Why: at a saturated loop (1,000 cards streaming) every runtime connection has a batch ready at every
    turn, and a turn handled all of them back to back: 250 batches of ~0.3 ms made a 75 ms turn, and
    every timer, click and card write waited behind it (the soak's lag p99 50-130 ms). The work is the
    same either way; what changes is that a turn ends after ``slice_seconds`` of batches, so the loop
    runs what else is ready between two slices. A batch that waits holds nothing but its request.

    A turn is noticed by its first batch, which schedules ``_next_turn`` with ``call_soon``: it runs at
    the start of the loop's next iteration, before that iteration's I/O and timers. It releases as many
    waiting batches as fit in a slice at the cost measured in the turns before (their tasks run in the
    turn after: a future's waiter always resumes one iteration later). A released batch still starts
    only while its turn has room; the estimate decides how many wake, the slice how many run.
    """

    def __init__(
        self,
        slice_seconds: float = BATCH_SLICE_SECONDS,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_wait: Callable[[], None] = lambda: None,
    ) -> None:
        """``clock``: real time (a turn's length is real; tests move their own). ``on_wait``: called for
        each batch that waits (``fp_batch_turn_waits_total``)."""
        self._slice = slice_seconds
        self._now = clock
        self._on_wait = on_wait
        self._turn_started: float | None = None  # the clock at this turn's first batch
        self._batches_this_turn = 0
        self._cost = slice_seconds / 16  # seconds of a turn per batch, measured
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._next_turn_due = False
        self._put_back = 0  # released batches put back first in line this turn (they keep their order)

    async def take_turn(self) -> None:
        """Return when this batch may run: at once while the turn has room, else in a later turn."""
        if not self._waiting and self._has_room():
            self._begin()
            return
        self._on_wait()
        await self._wait(len(self._waiting))
        while not self._has_room():  # released on an estimate the turn's batches went past: first again
            self._put_back += 1
            await self._wait(self._put_back - 1)
        self._begin()

    async def _wait(self, place: int) -> None:
        """Wait at ``place`` in line for a turn that releases it.

        Cancelled while it waits (the runtime hung up), the next turns skip it. Cancelled after its
        release, the place is lost for that turn only: each turn that leaves batches waiting schedules
        the next."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.insert(place, future)
        self._schedule_next_turn()
        await future

    def _has_room(self) -> bool:
        started = self._turn_started
        return started is None or self._now() - started < self._slice

    def _begin(self) -> None:
        if self._turn_started is None:
            self._turn_started = self._now()
            self._schedule_next_turn()
        self._batches_this_turn += 1

    def _schedule_next_turn(self) -> None:
        if not self._next_turn_due:
            self._next_turn_due = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._next_turn_due = False
        if self._turn_started is not None and self._batches_this_turn:
            per_batch = (self._now() - self._turn_started) / self._batches_this_turn
            self._cost += (per_batch - self._cost) * _COST_WEIGHT
        self._turn_started, self._batches_this_turn, self._put_back = None, 0, 0
        self._release(max(1, int(self._slice / max(self._cost, 1e-6))))

    def _release(self, count: int) -> None:
        while count > 0 and self._waiting:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                count -= 1
        if self._waiting:
            self._schedule_next_turn()


class HeavyGate:
    """At most ``concurrency`` large request bodies in progress; the rest queue, or 429 after ``max_wait``.
    Every event batch also takes its ``turn`` of the loop (``LoopShare``)."""

    def __init__(
        self,
        *,
        concurrency: int = 1,
        max_wait: float = 10.0,
        threshold: int = LARGE_BODY_BYTES,
        batch_slice_seconds: float = BATCH_SLICE_SECONDS,
        on_batch_wait: Callable[[], None] = lambda: None,
    ) -> None:
        self.share = LoopShare(batch_slice_seconds, on_wait=on_batch_wait)
        self._slots = asyncio.Semaphore(concurrency)
        self._max_wait = max_wait
        self._threshold = threshold
        self.waiting = 0
        self._urgent = 0
        self._no_urgent = asyncio.Event()
        self._no_urgent.set()

    def is_large(self, request: web.Request) -> bool:
        # No Content-Length (chunked): as large as the cap allows.
        length = request.content_length
        return length is None or length > self._threshold

    @asynccontextmanager
    async def admit(self, request: web.Request) -> AsyncIterator[None]:
        if not self.is_large(request):
            yield
            return
        self.waiting += 1
        try:
            async with asyncio.timeout(self._max_wait):
                await self._slots.acquire()
        except TimeoutError:
            raise HttpError(
                429, "too_busy", "too many large bodies in progress; retry", retry_after=1
            ) from None
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    @contextmanager
    def urgent(self) -> Iterator[None]:
        """A click is being answered: large bodies in progress wait at their next ``give_way``."""
        self._urgent += 1
        self._no_urgent.clear()
        try:
            yield
        finally:
            self._urgent -= 1
            if not self._urgent:
                self._no_urgent.set()

    async def give_way(self) -> None:
        """Between a large body's steps: what is ready runs first, then any click being answered ends."""
        await asyncio.sleep(0)
        if self._urgent:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GIVE_WAY_SECONDS):
                    await self._no_urgent.wait()
