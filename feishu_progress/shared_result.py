"""One result that many concurrent callers wait for: the one way a future is shared here.

Four rooms need it — the token fetch (feishu/client.py), an upload per image digest (images/uploads.py),
a group commit's batch (group_commit.py) and a batched subagent query (subagents/batcher.py). In each,
every waiter awaits the future through ``asyncio.shield`` (one impatient waiter's cancellation must not
cancel the work the others wait on), and a failure with nobody left waiting is not reported by asyncio
as "exception never retrieved": every waiter there was saw it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")


def shared_future() -> asyncio.Future[Any]:
    """A new future of the running loop, to be settled once and awaited with ``wait_shared``."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.add_done_callback(_retrieved)
    return future


def shared_work(work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """``work`` started once as a task that every caller then awaits with ``wait_shared``."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_retrieved)
    return task


async def wait_shared(future: asyncio.Future[T]) -> T:
    """The shared result; cancelling this waiter leaves the work running for the others."""
    return await asyncio.shield(future)


def fail_all(futures: Iterable[asyncio.Future[Any]], error: BaseException) -> None:
    """Every waiter of these futures that is still waiting gets ``error``."""
    for future in futures:
        if not future.done():
            future.set_exception(error)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
