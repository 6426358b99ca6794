"""The one holder of background tasks (aiogram's pattern): tracked, failures logged, drained on shutdown.

Slow work started from a request (image uploads, a callback handler past its deadline), the scheduler's
sends and the subagent batcher's queries all run in one of these: none of them is a bare ``create_task``
whose failure would vanish or which shutdown would never wait for. Two kinds of task stay outside it
on purpose, because their owner already awaits or cancels them: a long-lived loop an object starts and
cancels in its own ``close()`` (the scheduler's dispatcher, the Redis prober of cluster mode, the
client's delayed flush), and a future its creator awaits at once (a shared token refresh, a race
between an event and a timer in ``waiting.py`` and the callback pipeline).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self) -> None:
        """Cancel every task and wait until they have all ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for running tasks, cancel the rest; return how many were cancelled."""
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)
