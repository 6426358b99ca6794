"""FairSlots: each task at most its share, a freed slot to the task holding fewest, nothing leaked."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from feishu_progress.images.fair import FairSlots, SlotLease


async def _holder(slots: FairSlots, owner: Hashable, order: list[Hashable], release: asyncio.Event) -> None:
    async with slots.hold(owner):
        order.append(owner)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_owner_takes_at_most_its_share_and_another_is_served_at_once() -> None:
    slots = FairSlots(capacity=4, per_owner=2)
    order: list[Hashable] = []
    release = asyncio.Event()
    slow = [asyncio.create_task(_holder(slots, "a", order, release)) for _ in range(18)]
    await _settle()
    assert order == ["a", "a"] and slots.waiting == 16
    other = asyncio.create_task(_holder(slots, "b", order, release))
    await _settle()
    assert order == ["a", "a", "b"], "the other owner waited behind the first one's queue"
    release.set()
    await asyncio.gather(*slow, other)
    assert slots.held_by("a") == slots.held_by("b") == 0 and slots.waiting == 0


async def test_a_freed_slot_goes_to_the_waiting_owner_holding_fewest() -> None:
    slots = FairSlots(capacity=2, per_owner=2)
    taken: list[Hashable] = []
    gates = {name: asyncio.Event() for name in ("a1", "a2", "a3", "b1")}

    async def hold(owner: str, gate: str) -> None:
        async with slots.hold(owner):
            taken.append(gate)
            await gates[gate].wait()

    tasks = [asyncio.create_task(hold("a", gate)) for gate in ("a1", "a2", "a3")]
    await _settle()
    tasks.append(asyncio.create_task(hold("b", "b1")))  # came after a3, but holds nothing
    await _settle()
    assert taken == ["a1", "a2"]
    gates["a1"].set()
    await _settle()
    assert taken == ["a1", "a2", "b1"]
    gates["a2"].set()
    await _settle()
    assert taken == ["a1", "a2", "b1", "a3"]
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks)


async def test_a_lease_released_early_frees_its_slot_once() -> None:
    slots = FairSlots(capacity=1, per_owner=1)
    leases: list[SlotLease] = []
    async with slots.hold("a") as lease:
        leases.append(lease)
        lease.release()
        async with slots.hold("a"):  # the slot is free again for the same owner
            assert slots.held_by("a") == 1
        lease.release()  # a second release gives nothing back twice
    assert slots.held_by("a") == 0
    async with slots.hold("b"), asyncio.timeout(1):
        assert slots.held_by("b") == 1


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    slots = FairSlots(capacity=1, per_owner=1)
    async with slots.hold("a"):
        waiter = asyncio.create_task(slots.hold("b").__aenter__())
        await _settle()
        assert slots.waiting == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert slots.waiting == 0
    async with slots.hold("c"):
        assert slots.held_by("c") == 1 and slots.held_by("b") == 0


async def test_a_waiter_cancelled_after_its_grant_gives_the_slot_back() -> None:
    slots = FairSlots(capacity=1, per_owner=1)
    first = slots.hold("a")
    await first.__aenter__()
    waiter = asyncio.create_task(slots.hold("b").__aenter__())
    await _settle()
    await first.__aexit__(None, None, None)  # grants b's future; b has not resumed yet
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.held_by("b") == 0
    async with slots.hold("c"), asyncio.timeout(1):
        assert slots.held_by("c") == 1
