"""Who writes which card (cluster mode): ``task_card.owner_instance`` and its fencing epoch ``fence``.

Taking a card is a compare-and-set on (owner, fence) under a locking read that skips locked rows: of
two instances that race for an orphan, one locks and moves it, and the other skips it or, once the
first committed, no longer finds it as it saw it — so a card has one writer, and a row held by a
paused instance's open transaction is passed over rather than waited for.
Every take bumps ``fence``; every save of the card's state is conditioned on this instance still being
its owner (runtime/snapshots.py), so an instance that lost a card can no longer overwrite it.

An orphan is a card whose owner's lease has expired or is draining — or one released by a graceful
hand-over (owner NULL) while still unfinished. Finished cards whose owner died are taken too (their
final state may not have reached Feishu); a finished card leaves ownership (owner NULL) once its final
state is delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, literal_column, or_, select, text, tuple_, update

from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceLease, TaskCard
from feishu_progress.db.repo import UNFINISHED_STATUSES

# A dead instance's cards are usually found in one scan (a scan lists at most this many).
ORPHANS_PER_SCAN = 200


@dataclass(frozen=True, slots=True)
class Ownership:
    session_id: int
    owner: str | None
    fence: int
    owner_alive: bool
    expired_for: float = 0.0  # seconds since the owner's lease ran out, on the database's clock


@dataclass(frozen=True, slots=True)
class Taken:
    session_id: int
    fence: int
    from_dead_owner: bool  # True: it may still have a write in flight (wait before writing)
    expired_for: float = 0.0  # how long the dead owner's lease had run out when it was taken


class OwnershipRepository:
    def __init__(self, db: Database, instance_id: str) -> None:
        self._db = db
        self.me = instance_id

    def _alive(self) -> ColumnElement[bool]:
        return and_(InstanceLease.expires_at > text("UTC_TIMESTAMP(6)"), ~InstanceLease.draining)

    def _expired_for(self) -> ColumnElement[Any]:
        # 0 when the owner's lease row is gone (unknown: the new owner waits the whole write timeout).
        return func.coalesce(
            func.timestampdiff(
                literal_column("MICROSECOND"), InstanceLease.expires_at, text("UTC_TIMESTAMP(6)")
            ),
            0,
        )

    async def of(self, session_id: int) -> Ownership | None:
        """The card's owner and fence, and whether that owner's lease is live (None: no such task)."""
        statement = (
            select(
                TaskCard.owner_instance,
                TaskCard.fence,
                InstanceLease.instance_id.is_not(None) & self._alive(),
                self._expired_for(),
            )
            .outerjoin(InstanceLease, InstanceLease.instance_id == TaskCard.owner_instance)
            .where(TaskCard.session_id == session_id)
        )
        async with self._db.engine.connect() as connection:
            row = (await connection.execute(statement)).first()
        if row is None:
            return None
        return Ownership(session_id, row[0], int(row[1]), bool(row[2]), _seconds(row[3]))

    async def orphans(self, limit: int = ORPHANS_PER_SCAN) -> list[Ownership]:
        """Cards nobody live writes: a dead or draining owner, or released while unfinished."""
        dead = or_(InstanceLease.instance_id.is_(None), ~self._alive())
        statement = (
            select(TaskCard.session_id, TaskCard.owner_instance, TaskCard.fence, self._expired_for())
            .outerjoin(InstanceLease, InstanceLease.instance_id == TaskCard.owner_instance)
            .where(
                TaskCard.message_id.is_not(None),
                or_(
                    and_(TaskCard.owner_instance.is_(None), TaskCard.status.in_(UNFINISHED_STATUSES)),
                    and_(TaskCard.owner_instance.is_not(None), TaskCard.owner_instance != self.me, dead),
                ),
            )
            .order_by(TaskCard.session_id)
            .limit(limit)
        )
        async with self._db.engine.connect() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            Ownership(int(sid), owner, int(fence), False, _seconds(expired))
            for sid, owner, fence, expired in rows
        ]

    async def mine(self) -> list[Ownership]:
        """Cards the database says this instance writes (after a restart with the same id)."""
        statement = select(TaskCard.session_id, TaskCard.fence).where(TaskCard.owner_instance == self.me)
        async with self._db.engine.connect() as connection:
            rows = (await connection.execute(statement)).all()
        return [Ownership(int(sid), self.me, int(fence), True) for sid, fence in rows]

    async def take_many(self, seen: Sequence[Ownership]) -> list[Taken]:
        """Become the owner of the cards of ``seen`` still as seen (owner and fence unchanged) and not
        locked right now, in one transaction; each take bumps the fence. The cards taken.

        A row another transaction holds is skipped (``SKIP LOCKED``), not waited for: a paused instance
        may hold the lock of a card it was saving, and waiting for it (up to the server's lock wait)
        would hold up every other card of the batch. A skipped card is tried again at the next scan.
        """
        if not seen:
            return []
        by_id = {card.session_id: card for card in seen}
        async with self._db.engine.begin() as connection:
            free = (
                await connection.execute(
                    select(TaskCard.session_id)
                    .where(TaskCard.session_id.in_(list(by_id)), _as_seen(seen))
                    .with_for_update(skip_locked=True)
                )
            ).scalars()
            ids = list(free)
            if ids:
                await connection.execute(
                    update(TaskCard)
                    .where(TaskCard.session_id.in_(ids))
                    .values(owner_instance=self.me, fence=TaskCard.fence + 1)
                )
        return [self._taken(by_id[session_id]) for session_id in ids]

    def _taken(self, seen: Ownership) -> Taken:
        dead_owner = seen.owner is not None and seen.owner != self.me
        return Taken(seen.session_id, seen.fence + 1, dead_owner, seen.expired_for if dead_owner else 0.0)

    async def release(self, session_ids: Sequence[int]) -> None:
        """Stop owning these cards (a finished card delivered, or a graceful hand-over)."""
        if not session_ids:
            return
        async with self._db.engine.begin() as connection:
            await connection.execute(
                update(TaskCard)
                .where(TaskCard.session_id.in_(list(session_ids)), TaskCard.owner_instance == self.me)
                .values(owner_instance=None)
            )


def _as_seen(seen: Sequence[Ownership]) -> ColumnElement[bool]:
    """Rows whose owner and fence are still what ``seen`` says (a row per card, as ``take`` checks)."""
    owned = [(card.session_id, card.owner, card.fence) for card in seen if card.owner is not None]
    released = [(card.session_id, card.fence) for card in seen if card.owner is None]
    conditions: list[ColumnElement[bool]] = []
    if owned:
        conditions.append(tuple_(TaskCard.session_id, TaskCard.owner_instance, TaskCard.fence).in_(owned))
    if released:
        conditions.append(
            and_(TaskCard.owner_instance.is_(None), tuple_(TaskCard.session_id, TaskCard.fence).in_(released))
        )
    return or_(*conditions)


def _seconds(microseconds: Any) -> float:
    """A TIMESTAMPDIFF in microseconds as seconds, never below 0 (a live lease has not run out)."""
    return max(0.0, int(microseconds or 0) / 1_000_000)
