"""Group commit: many callers' writes in one transaction, each caller answered once its write is durable.

One write runs at a time; whatever is submitted while it runs goes into the next one. Under no load a
write is a single transaction, as before; under load (200 clicks at once) a handful of transactions
carry them all, instead of 200 queued behind one database lock (measured on SQLite: 126 of 200 clicks
waited on the lock when each wrote alone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from feishu_progress.background import BackgroundTasks
from feishu_progress.shared_result import fail_all, shared_future, wait_shared

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")
WriteBatch = Callable[[Sequence[Item]], Awaitable[Sequence[Result]]]

DEFAULT_MAX_BATCH = 500


class GroupCommit(Generic[Item, Result]):
    """``await submit(item)`` returns ``write_batch``'s result for that item, or raises its error."""

    def __init__(
        self,
        write_batch: WriteBatch[Item, Result],
        background: BackgroundTasks,
        *,
        name: str,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._write_batch = write_batch
        self._background = background
        self._name = name
        self._max_batch = max_batch
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future[Result] = shared_future()
        self._queue.append((item, future))
        if self._writer is None or self._writer.done():
            self._writer = self._background.spawn(self._drain(), name=f"group-commit-{self._name}")
        return await wait_shared(future)  # a caller that stops waiting leaves the others' write alone

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            await self._write(batch)

    async def _write(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._write_batch([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)} items")
        except Exception as exc:
            fail_all((future for _, future in batch), exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
