"""The one way to wait for "this event, or that much clock time": loops, the scheduler and long-polls use it.

Waiting goes through the injected ``Clock`` so tests move time instead of sleeping.
"""

from __future__ import annotations

import asyncio

from feishu_progress.ports import Clock


async def event_or_timeout(event: asyncio.Event, clock: Clock, timeout: float | None) -> bool:
    """Wait until ``event`` is set (True) or ``timeout`` seconds of clock time pass (False)."""
    if event.is_set():
        return True
    if timeout is None:
        await event.wait()
        return True
    waiter = asyncio.ensure_future(event.wait())
    sleeper = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        sleeper.cancel()
        await asyncio.gather(waiter, sleeper, return_exceptions=True)
    return event.is_set()


class Stopper:
    """Lets periodic loops pause between passes and end promptly once ``stop`` is called."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._stopping = asyncio.Event()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Loops end after their current pass (a database call is never cut short)."""
        self._stopping.set()

    async def pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` of clock time; False (at once) when the loops should end."""
        return not await event_or_timeout(self._stopping, self._clock, seconds)
