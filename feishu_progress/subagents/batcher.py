"""All live cards' subagent loads in at most a couple of queries a second, whatever the number of cards.

Each live card asks for its own parent's running subagents (1 s cache, seed 002 §4.3). With a thousand
running cards that would be a thousand queries a second. The batcher gathers the parents asked for while
a query is due and answers them all from ONE batched ``IN (...)`` query (seed 002 §4.1, batched form): the
first request after a quiet spell runs at once, later ones wait for the next query slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from feishu_progress.background import BackgroundTasks
from feishu_progress.domain import SubagentSummary
from feishu_progress.ports import Clock, SubagentSource
from feishu_progress.shared_result import fail_all, shared_future, wait_shared

log = logging.getLogger(__name__)

DEFAULT_QUERIES_PER_SECOND = 2.0


class BatchedSubagentSource:
    """A SubagentSource that coalesces concurrent ``list_running`` calls into batched queries."""

    def __init__(
        self,
        source: SubagentSource,
        clock: Clock,
        background: BackgroundTasks,
        *,
        queries_per_second: float = DEFAULT_QUERIES_PER_SECOND,
    ) -> None:
        self._source = source
        self._clock = clock
        self._background = background
        self._interval = 1.0 / queries_per_second
        self._pending: dict[int, asyncio.Future[list[SubagentSummary]]] = {}
        self._last_query: float | None = None
        self._runner: asyncio.Task[None] | None = None
        self.queries = 0

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        future = self._pending.get(parent_session_id)
        if future is None:
            future = self._pending[parent_session_id] = shared_future()
        if self._runner is None or self._runner.done():
            self._runner = self._background.spawn(self._run(), name="subagent-batcher")
        return await wait_shared(future)

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        parents = list(parent_session_ids)
        lists = await asyncio.gather(*(self.list_running(parent) for parent in parents))
        return dict(zip(parents, lists, strict=True))

    async def _run(self) -> None:
        while self._pending:
            if self._last_query is not None:
                wait = self._last_query + self._interval - self._clock.monotonic()
                if wait > 0:
                    await self._clock.sleep(wait)
            batch, self._pending = self._pending, {}
            self._last_query = self._clock.monotonic()
            self.queries += 1
            await self._answer(batch)

    async def _answer(self, batch: dict[int, asyncio.Future[list[SubagentSummary]]]) -> None:
        try:
            result = await self._source.list_running_many(batch.keys())
        except Exception as exc:
            fail_all(batch.values(), exc)
            return
        for parent, future in batch.items():
            if not future.done():
                future.set_result(list(result.get(parent, [])))
