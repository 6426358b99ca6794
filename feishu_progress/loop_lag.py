"""The event loop's lag seen from inside the process: how late a timer fires (``fp_event_loop_lag_seconds``).

Everything the service does shares one event loop, and each step runs to its end before the next one
starts: parsing a batch, building a card, dumping a snapshot. A long step delays every timer and every
answer queued behind it (including a click's, which Feishu cuts off at 3 s). A sleep that wakes X late
means a ready callback waited X, so the monitor puts each overshoot in a histogram. Prometheus, the
dashboard and ``bench/soak.py`` then read the lag from outside the process.

Every 0.1 s: that is 600 samples a minute, so a one-minute p99 rests on the 6 largest and is more than
the minute's maximum. A step of D ms lands on a wake-up with a chance of about D / 100 ms, so steps of
tens of ms show up within seconds. Ten wake-ups a second cost microseconds each. Sampling more often
costs more wake-ups and shows little more; sampling every second leaves 60 samples a minute, and then
p99 is just the maximum.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

from feishu_progress.waiting import Stopper

LAG_INTERVAL_SECONDS = 0.1


async def watch_loop_lag(
    histogram: Histogram, stopper: Stopper, interval: float = LAG_INTERVAL_SECONDS
) -> None:
    """Sleep ``interval`` again and again and observe how late each wake-up was, until the loops stop."""
    # The loop's own clock, not the app's Clock: lag is real time. Tests fake the Clock (a FakeClock would
    # report a test's jump of minutes as lag), and benches scale it (×5 would be reported as 5× the lag).
    # A bare sleep, not Stopper.pause: pause wakes through two more futures, and under load each one waits
    # another turn of the loop, which would add to every sample. The cost is that shutdown waits up to
    # one interval for this loop to end.
    loop = asyncio.get_running_loop()
    while not stopper.stopping:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        histogram.observe(max(0.0, loop.time() - due))  # a timer may fire a hair early
