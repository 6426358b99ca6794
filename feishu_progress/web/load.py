"""Load isolation for the runtime API: a few large bodies at a time, so a flood of them cannot starve
card clicks (issue 26: 30 concurrent 8 MB batches pushed clicks past Feishu's 3 s).

Everything done for a large body — reading it, parsing, validating, applying — runs on the event loop in
stretches of tens of milliseconds that nothing else can interrupt. Thirty of them interleaved put a
click's every step behind thirty such stretches; ``HeavyGate`` lets ``concurrency`` large bodies in at a
time (others wait their turn, or get 429 with ``Retry-After`` past ``max_wait``), so a click waits for at
most one stretch, and the bytes held in memory are bounded too. Small bodies (most batches: a few
deltas) never wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from feishu_progress.web.http import HttpError

LARGE_BODY_BYTES = 256 * 1024


class HeavyGate:
    """At most ``concurrency`` large request bodies in progress; the rest queue, or 429 after ``max_wait``."""

    def __init__(
        self, *, concurrency: int = 1, max_wait: float = 10.0, threshold: int = LARGE_BODY_BYTES
    ) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._max_wait = max_wait
        self._threshold = threshold
        self.waiting = 0

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
