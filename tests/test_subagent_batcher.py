"""The batcher answers every live card's subagent load from at most a couple of queries a second."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from feishu_progress.background import BackgroundTasks
from feishu_progress.domain import SubagentSummary
from feishu_progress.subagents.batcher import BatchedSubagentSource
from tests.fakes import FakeClock


class CountingSource:
    def __init__(self, clock: FakeClock, delay: float = 0.05) -> None:
        self.clock = clock
        self.delay = delay
        self.batches: list[list[int]] = []
        self.fail = False

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        return (await self.list_running_many([parent_session_id]))[parent_session_id]

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        parents = list(parent_session_ids)
        self.batches.append(parents)
        await self.clock.sleep(self.delay)
        if self.fail:
            raise RuntimeError("db down")
        return {p: [SubagentSummary(p * 10, "explorer", f"t{p}", "RUNNING", 1)] for p in parents if p % 2}


CARDS = 1000


async def test_a_thousand_cards_cost_at_most_two_queries_a_second() -> None:
    clock = FakeClock()
    source = CountingSource(clock)
    batcher = BatchedSubagentSource(source, clock, BackgroundTasks())

    async def card(parent: int) -> None:
        for _ in range(5):  # each card reloads once a second (its 1 s cache) for 5 s
            result = await batcher.list_running(parent)
            assert [s.task_id for s in result] == ([parent * 10] if parent % 2 else [])
            await clock.sleep(1.0)

    tasks = [asyncio.create_task(card(parent)) for parent in range(CARDS)]
    await clock.advance(10.0)
    assert all(task.done() for task in tasks)
    await asyncio.gather(*tasks)
    assert len(source.batches) <= 2 * 10
    assert sum(len(batch) for batch in source.batches) == 5 * CARDS  # every load answered, none lost


async def test_the_first_load_after_a_quiet_spell_runs_at_once() -> None:
    clock = FakeClock()
    source = CountingSource(clock, delay=0.0)
    batcher = BatchedSubagentSource(source, clock, BackgroundTasks())
    first = asyncio.create_task(batcher.list_running(1))
    await clock.settle()
    assert first.done()
    await clock.advance(5.0)
    again = asyncio.create_task(batcher.list_running(3))
    await clock.settle()
    assert again.done() and len(source.batches) == 2


async def test_a_failing_query_fails_every_waiter_of_that_batch_only() -> None:
    clock = FakeClock()
    source = CountingSource(clock)
    batcher = BatchedSubagentSource(source, clock, BackgroundTasks())
    source.fail = True
    waiters = [asyncio.create_task(batcher.list_running(p)) for p in (1, 2)]
    await clock.advance(0.1)
    for waiter in waiters:
        with pytest.raises(RuntimeError):
            await waiter
    source.fail = False
    later = asyncio.create_task(batcher.list_running(1))
    await clock.advance(1.0)
    assert [s.task_id for s in await later] == [10]
