"""Takeover pieces (issue 26 item 3), each on its own: a batched take on MariaDB that passes over a row
another transaction holds, a paused instance's idle transaction ended by the server, the split of a
dead instance's cards between the live ones, and urgent calls ahead at the shared budget's gate.

tests/test_cluster_mode.py runs the whole takeover with three processes; bench/cluster_load.py measures
it at 200 cards (kill -9 and SIGSTOP).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import delete, insert, select, text, update

from feishu_progress.cluster.lease import end_stalled_transactions
from feishu_progress.cluster.mode import OrphanShares, UrgentFirst, drawn
from feishu_progress.cluster.ownership import Ownership, OwnershipRepository
from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceLease, SessionRow, TaskCard

pytestmark = pytest.mark.mysql


@pytest.fixture
async def mysql_db(mysql_url: str) -> AsyncIterator[Database]:
    database = Database.open(mysql_url)
    async with database.engine.begin() as connection:
        for table in (TaskCard, InstanceLease, SessionRow):
            await connection.execute(delete(table))
        for session_id in range(1, 6):
            await connection.execute(insert(SessionRow).values(id=session_id, title="t"))
            await connection.execute(
                insert(TaskCard).values(
                    session_id=session_id,
                    receive_id="oc_1",
                    receive_id_type="chat_id",
                    requester_open_id="ou_1",
                    message_id=f"om_{session_id}",
                    owner_instance="dead",
                    fence=7,
                )
            )
    try:
        yield database
    finally:
        await database.close()


def seen(session_id: int, owner: str | None = "dead", fence: int = 7) -> Ownership:
    return Ownership(session_id, owner, fence, owner_alive=False, expired_for=1.0)


async def owners(db: Database) -> dict[int, tuple[str | None, int]]:
    async with db.engine.connect() as connection:
        rows = await connection.execute(select(TaskCard.session_id, TaskCard.owner_instance, TaskCard.fence))
    return {sid: (owner, fence) for sid, owner, fence in rows}


async def test_take_many_takes_the_cards_still_as_seen_and_moves_their_fence(mysql_db: Database) -> None:
    async with mysql_db.engine.begin() as connection:  # card 2 changed hands since the scan saw it
        await connection.execute(update(TaskCard).where(TaskCard.session_id == 2).values(fence=8))
    taken = await OwnershipRepository(mysql_db, "me").take_many([seen(1), seen(2), seen(3)])
    assert {(card.session_id, card.fence, card.from_dead_owner) for card in taken} == {
        (1, 8, True),
        (3, 8, True),
    }
    after = await owners(mysql_db)
    assert {sid: after[sid] for sid in (1, 2, 3)} == {1: ("me", 8), 2: ("dead", 8), 3: ("me", 8)}
    assert await OwnershipRepository(mysql_db, "other").take_many([seen(1)]) == [], "taken once only"


async def test_take_many_passes_over_a_row_another_transaction_holds(mysql_db: Database) -> None:
    """A paused instance in the middle of saving card 2 holds its row: the others are taken at once."""
    holder = await mysql_db.engine.connect()
    transaction = await holder.begin()
    await holder.execute(update(TaskCard).where(TaskCard.session_id == 2).values(round=1))
    try:
        started = time.monotonic()
        taken = await OwnershipRepository(mysql_db, "me").take_many([seen(1), seen(2), seen(3)])
        assert time.monotonic() - started < 10, "waited for the lock"  # the server's lock wait is 50 s
        assert sorted(card.session_id for card in taken) == [1, 3]
    finally:
        await transaction.rollback()
        await holder.close()
    assert [card.session_id for card in await OwnershipRepository(mysql_db, "me").take_many([seen(2)])] == [2]


async def test_a_transaction_left_idle_past_the_lease_is_ended_and_its_card_taken(mysql_db: Database) -> None:
    if not mysql_db.engine.dialect.is_mariadb:  # type: ignore[attr-defined]
        pytest.skip("idle_write_transaction_timeout is MariaDB's")
    paused = Database.open(mysql_db.url)
    end_stalled_transactions(paused, 1.0)
    try:
        connection = await paused.engine.connect()
        await connection.begin()
        await connection.execute(update(TaskCard).where(TaskCard.session_id == 4).values(round=1))
        await asyncio.sleep(2.5)  # "paused": the server ends the idle transaction after 1 s
        assert [c.session_id for c in await OwnershipRepository(mysql_db, "me").take_many([seen(4)])] == [4]
        with pytest.raises(Exception, match=r"Lost connection|gone away|2013|2006"):
            await connection.execute(text("SELECT 1"))
        await connection.invalidate()
    finally:
        await paused.close()
    assert (await owners(mysql_db))[4] == ("me", 8), "the idle transaction's change was rolled back"


def test_a_dead_instances_cards_are_split_between_the_live_ones_without_overlap() -> None:
    orphans = [seen(session_id) for session_id in range(1, 301)]
    live = ["fp-0", "fp-1", "dead"]  # the last heartbeat still counted the dead one
    shares = {name: OrphanShares(name).mine(orphans, live) for name in ("fp-0", "fp-1")}
    ids = {name: {orphan.session_id for orphan in share} for name, share in shares.items()}
    assert ids["fp-0"].isdisjoint(ids["fp-1"]) and ids["fp-0"] | ids["fp-1"] == set(range(1, 301))
    assert 110 <= len(ids["fp-0"]) <= 190, "roughly half each"
    assert Counter(drawn(["fp-0", "fp-1"], sid) for sid in range(1, 301)) == Counter(
        {name: len(share) for name, share in ids.items()}
    )


def test_cards_left_to_a_peer_that_did_not_take_them_are_taken_at_the_next_scan() -> None:
    orphans = [seen(session_id) for session_id in range(1, 41)]
    share = OrphanShares("fp-0")
    first = {orphan.session_id for orphan in share.mine(orphans, ["fp-0", "fp-1"])}
    assert 0 < len(first) < 40
    still = [orphan for orphan in orphans if orphan.session_id not in first]  # fp-1 is slow
    assert {orphan.session_id for orphan in share.mine(still, ["fp-0", "fp-1"])} == set(range(1, 41)) - first


async def test_an_ordinary_call_waits_while_an_urgent_one_waits_for_the_same_api() -> None:
    order = UrgentFirst()
    budget = asyncio.Event()  # the shared budget: no room until set
    went: list[str] = []

    async def call(name: str, api: str, urgent: bool) -> None:
        async with order.turn(api, urgent=urgent):
            if urgent:
                await budget.wait()
            went.append(name)

    urgent = asyncio.create_task(call("urgent", "card", True))
    await asyncio.sleep(0)
    ordinary = asyncio.create_task(call("ordinary", "card", False))
    other_api = asyncio.create_task(call("text", "text", False))
    await other_api  # never waits: the urgent call waits on another API's budget
    assert went == ["text"] and not ordinary.done(), "the same API's ordinary call waits, another API's not"
    budget.set()
    await asyncio.gather(urgent, ordinary, other_api)
    assert went == ["text", "urgent", "ordinary"]
