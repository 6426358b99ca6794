import asyncio

from tests.fakes import FakeClock, InstantClock


async def test_fake_clock_wakes_sleepers_in_order() -> None:
    clock = FakeClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(sleeper("late", 2.0)), asyncio.create_task(sleeper("early", 0.5))]
    await clock.advance(1.0)
    assert woke == [("early", 0.5)]
    await clock.advance(1.0)
    assert woke == [("early", 0.5), ("late", 2.0)]
    await asyncio.gather(*tasks)


async def test_instant_clock_moves_its_time_by_each_sleep_without_waiting() -> None:
    clock = InstantClock(start=0.0, wall_start=100.0)
    await clock.sleep(2.5)
    await clock.sleep(-1.0)
    assert clock.sleeps == [2.5, -1.0]
    assert (clock.monotonic(), clock.wall()) == (2.5, 102.5)


async def test_instant_clock_runs_its_hook_while_the_caller_sleeps() -> None:
    clock = InstantClock()
    seen: list[float] = []
    clock.on_sleep = seen.append
    await clock.sleep(0.3)
    assert seen == [0.3]
