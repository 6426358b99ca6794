"""The event-loop lag monitor (loop_lag.py): a step that holds the loop shows in the histogram, as long."""

from __future__ import annotations

import asyncio
import time

from feishu_progress.loop_lag import watch_loop_lag
from feishu_progress.metrics import Metrics
from feishu_progress.ports import SystemClock
from feishu_progress.waiting import Stopper


async def test_a_step_that_holds_the_loop_is_observed_as_lag_and_the_monitor_ends_with_the_loops() -> None:
    metrics = Metrics()
    stopper = Stopper(SystemClock())
    monitor = asyncio.create_task(watch_loop_lag(metrics.event_loop_lag, stopper, interval=0.05))
    await asyncio.sleep(0.3)  # quiet samples
    time.sleep(0.3)  # a step that never yields, as a large batch's parse would be
    await asyncio.sleep(0.3)
    stopper.stop()
    await asyncio.wait_for(monitor, timeout=1.0)  # within one interval of the stop

    def count(le: str) -> float:
        return metrics.value("fp_event_loop_lag_seconds_bucket", {"le": le})

    samples = count("+Inf")
    assert samples >= 8
    assert count("+Inf") - count("0.25") >= 1  # the held step, at its length (at least 0.25 s of its 0.3)
    # The overshoot, not the time slept: a quiet loop wakes well within 10 ms of the 50 ms asked.
    assert count("0.01") >= samples / 2
