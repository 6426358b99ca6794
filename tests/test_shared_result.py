"""The one way a future is shared by concurrent callers (feishu_progress/shared_result.py)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from feishu_progress.shared_result import fail_all, shared_future, shared_work, wait_shared


async def test_a_waiter_that_gives_up_leaves_the_work_to_the_others() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def work() -> str:
        started.set()
        await release.wait()
        return "token"

    shared = shared_work(work())
    impatient = asyncio.ensure_future(wait_shared(shared))
    patient = asyncio.ensure_future(wait_shared(shared))
    await started.wait()
    impatient.cancel()
    release.set()
    assert await patient == "token"
    assert impatient.cancelled() and not shared.cancelled()


async def _unretrieved_report(make: object, caplog: pytest.LogCaptureFixture) -> bool:
    """Whether asyncio reports "exception never retrieved" for a failed future nobody awaited."""
    caplog.clear()
    future = make()  # type: ignore[operator]
    fail_all([future], RuntimeError("database gone"))
    del future
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gc.collect()
        await asyncio.sleep(0)
    return "never retrieved" in caplog.text


async def test_a_failure_nobody_waits_for_any_more_is_not_reported_as_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert await _unretrieved_report(lambda: asyncio.get_running_loop().create_future(), caplog)
    assert not await _unretrieved_report(shared_future, caplog)
