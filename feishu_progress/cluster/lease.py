"""This instance's lease (cluster mode): a heartbeat row on the database's clock, and a local deadline.

The database row says to the others "I am alive until ``expires_at``" (UTC_TIMESTAMP, the database's
clock, so no two hosts' clocks are compared). Locally the instance keeps a stricter deadline on its own
monotonic clock: it starts no Open API write after ``sent + lease - margin``, where ``sent`` is when the
last successful heartbeat LEFT (so the row's expiry is surely later). A paused or partitioned instance
therefore stops writing before anyone may take its cards; a write it had in flight at that moment is
covered by the new owner, which waits ``write_timeout`` before its first write to a card it took.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, event, select, text, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.pool import ConnectionPoolEntry

from feishu_progress.config import ClusterSettings
from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceLease
from feishu_progress.ports import Clock
from feishu_progress.waiting import Stopper

log = logging.getLogger(__name__)

# How much earlier than the lease this instance stops starting writes.
SAFETY_MARGIN_SECONDS = 0.5


def end_stalled_transactions(db: Database, seconds: float) -> None:
    """MariaDB: a transaction of ours left idle for ``seconds`` is ended by the server (rolled back).

    A paused instance (SIGSTOP, a frozen VM) keeps its connections open, and a transaction it had begun
    (a snapshot save) keeps its rows of ``task_card`` locked for as long as the pause lasts: the others
    could neither take those cards nor log batches for them. With the lease as the limit, the locks go
    when the lease does; our transactions never idle that long otherwise. MySQL has no such setting
    (there a paused instance's locked cards are taken once it resumes or its connection drops).
    """
    dialect = db.engine.dialect

    def on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        if "idle_write_transaction_timeout" in record.info:
            return
        if not getattr(dialect, "is_mariadb", False):  # known once the first connection was made
            record.info["idle_write_transaction_timeout"] = None
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"SET SESSION idle_write_transaction_timeout = {math.ceil(seconds)}")
        finally:
            cursor.close()
        record.info["idle_write_transaction_timeout"] = seconds

    event.listen(db.engine.sync_engine, "checkout", on_checkout)


def _db_now_plus(seconds: float) -> object:
    # MySQL/MariaDB only (cluster mode requires them): microseconds keep sub-second leases exact.
    return text(f"UTC_TIMESTAMP(6) + INTERVAL {int(seconds * 1_000_000)} MICROSECOND")


@dataclass(frozen=True, slots=True)
class Peer:
    instance_id: str
    address: str | None
    alive: bool


class LeaseKeeper:
    def __init__(
        self,
        db: Database,
        instance_id: str,
        address: str,
        settings: ClusterSettings,
        clock: Clock,
        *,
        heartbeat_db: Database | None = None,
    ) -> None:
        self._db = db
        # Heartbeats on connections of their own (``heartbeat_db``): behind a busy shared pool (a takeover
        # loading cards, a flood of batches) a renewal waited seconds for a connection and the lease of
        # a live instance ran out, which handed its cards to the others for nothing.
        self._heartbeat_db = heartbeat_db or db
        self.instance_id = instance_id
        self.address = address
        self._settings = settings
        self._clock = clock
        self._deadline = -1.0
        self._renewed_deadline = -1.0  # a renewal's deadline held back after a lapse (``renew``)
        self.live_ids: frozenset[str] = frozenset({instance_id})  # live leases at the last heartbeat
        self.lost = 0  # how many times this instance found its lease gone (paused, partitioned)

    def can_write(self) -> bool:
        """Whether this instance may start an Open API write now."""
        return self._clock.monotonic() < self._deadline

    @property
    def seconds_left(self) -> float:
        return self._deadline - self._clock.monotonic()

    def live_instances(self) -> int:
        """Instances with a live lease at the last heartbeat (at least this one)."""
        return max(1, len(self.live_ids))

    async def acquire(self) -> None:
        """Create (or take back, after a restart with the same id) this instance's lease row."""
        sent = self._clock.monotonic()
        lease = self._settings.lease_seconds
        statement = mysql_insert(InstanceLease).values(
            instance_id=self.instance_id,
            address=self.address,
            started_at=text("UTC_TIMESTAMP(6)"),
            heartbeat_at=text("UTC_TIMESTAMP(6)"),
            expires_at=_db_now_plus(lease),
            draining=False,
        )
        statement = statement.on_duplicate_key_update(
            address=statement.inserted.address,
            started_at=statement.inserted.started_at,
            heartbeat_at=statement.inserted.heartbeat_at,
            expires_at=statement.inserted.expires_at,
            draining=False,
        )
        async with self._heartbeat_db.engine.begin() as connection:
            await connection.execute(statement)
        self._deadline = sent + lease - SAFETY_MARGIN_SECONDS
        await self._count_live()

    async def renew(self) -> bool:
        """Extend the lease; False when the local deadline had already passed (the lease may be lost).

        Then writing stays off (``resume_writing``) until the caller has dropped the cards the others
        may have taken meanwhile: a write queued before the lapse must not slip out in between.
        """
        sent = self._clock.monotonic()
        was_valid = self.can_write()
        lease = self._settings.lease_seconds
        async with self._heartbeat_db.engine.begin() as connection:
            result = await connection.execute(
                update(InstanceLease)
                .where(InstanceLease.instance_id == self.instance_id)
                .values(heartbeat_at=text("UTC_TIMESTAMP(6)"), expires_at=_db_now_plus(lease), draining=False)
            )
        if result.rowcount == 0:
            await self.acquire()  # the row was removed (a peer's cleanup): this is a fresh start
            self._renewed_deadline, self._deadline = self._deadline, -1.0  # held until cards are dropped
            return False
        if was_valid:
            self._deadline = sent + lease - SAFETY_MARGIN_SECONDS
        else:
            self._renewed_deadline = sent + lease - SAFETY_MARGIN_SECONDS
        await self._count_live()
        return was_valid

    def resume_writing(self) -> None:
        """After a lapse: the lost cards are dropped, writes may start again (until the renewed deadline)."""
        self._deadline = max(self._deadline, self._renewed_deadline)

    async def _count_live(self) -> None:
        async with self._heartbeat_db.engine.connect() as connection:
            live = await connection.scalars(
                select(InstanceLease.instance_id).where(InstanceLease.expires_at > text("UTC_TIMESTAMP(6)"))
            )
            self.live_ids = frozenset(live) | {self.instance_id}

    async def run(self, stopper: Stopper, on_lost: Callable[[], Awaitable[None]]) -> None:
        """Heartbeat until stopped; ``on_lost`` when a renewal finds the local deadline had passed."""
        while await stopper.pause(self._settings.heartbeat_seconds):
            try:
                if not await self.renew():
                    self.lost += 1
                    log.error(
                        "the lease of %s had expired (paused or cut off): dropping its cards",
                        self.instance_id,
                    )
                    await on_lost()
                    self.resume_writing()
            except Exception as exc:  # the deadline runs out on its own: writes stop in time
                log.warning(
                    "lease heartbeat failed: %s (%.1f s of lease left)", type(exc).__name__, self.seconds_left
                )

    async def drain(self) -> None:
        """Graceful stop: tell the others at once (they take over without waiting for expiry)."""
        self._deadline = -1.0
        async with self._heartbeat_db.engine.begin() as connection:
            await connection.execute(
                update(InstanceLease)
                .where(InstanceLease.instance_id == self.instance_id)
                .values(draining=True, expires_at=text("UTC_TIMESTAMP(6)"))
            )

    async def remove(self) -> None:
        async with self._db.engine.begin() as connection:
            await connection.execute(
                delete(InstanceLease).where(InstanceLease.instance_id == self.instance_id)
            )

    async def peer(self, instance_id: str) -> Peer:
        """Where another instance listens, and whether its lease is live."""
        async with self._db.engine.connect() as connection:
            row = (
                await connection.execute(
                    select(
                        InstanceLease.address,
                        (InstanceLease.expires_at > text("UTC_TIMESTAMP(6)")) & ~InstanceLease.draining,
                    ).where(InstanceLease.instance_id == instance_id)
                )
            ).first()
        if row is None:
            return Peer(instance_id, None, False)
        return Peer(instance_id, row[0], bool(row[1]))
