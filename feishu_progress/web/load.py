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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from aiohttp import web

from feishu_progress.web.http import HttpError

LARGE_BODY_BYTES = 256 * 1024
# A large body waits at most this long per step for clicks being answered: a stream of clicks slows a
# flood of large bodies down, it never stops one.
GIVE_WAY_SECONDS = 0.5


class HeavyGate:
    """At most ``concurrency`` large request bodies in progress; the rest queue, or 429 after ``max_wait``."""

    def __init__(
        self, *, concurrency: int = 1, max_wait: float = 10.0, threshold: int = LARGE_BODY_BYTES
    ) -> None:
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
