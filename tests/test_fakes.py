import asyncio

from tests.fakes import FakeClock


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
