"""Single mode: one process owns a database (the ``instance_holder`` row).

Without cluster mode nothing fences two writers: a second ``serve`` on the same database would re-attach
the first one's cards and write them too. So before re-attaching anything a single-mode process claims
the row:

* no row: it is claimed;
* a row whose heartbeat is fresh (within ``stale_after`` seconds, on the database's clock): refused, and
  the refusal names the holder (instance id, host, pid) and the fix;
* a stale row (the holder crashed or hangs), or one this host's earlier process left (same host, and that
  pid is gone or is this very process, as after a container restart): taken over.

While serving, the heartbeat is renewed every ``heartbeat_seconds``; a graceful stop removes the row. A
holder whose row was taken meanwhile (it hung past ``stale_after``) logs it and turns not ready. Cluster
mode does not use this: its instances share a database by design (``cluster/lease.py``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import UTC

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceHolder, utc_now
from feishu_progress.errors import StartupRefused
from feishu_progress.waiting import Stopper

log = logging.getLogger(__name__)

HOLDER_ROW = 1  # the table holds at most this one row
HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 15.0  # three missed heartbeats
CLAIM_ATTEMPTS = 3  # two processes inserting at once: the loser reads the winner's row and refuses


@dataclass(frozen=True, slots=True)
class Holder:
    instance_id: str
    host: str
    pid: int
    heartbeat_age_seconds: float


class DatabaseHeld(StartupRefused):
    """Another single-mode process holds this database (its heartbeat is fresh)."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(
            f"this database is served by instance {holder.instance_id} (host {holder.host}, pid "
            f"{holder.pid}, heartbeat {holder.heartbeat_age_seconds:.0f} s ago); without cluster mode one "
            "process owns a database: stop that one, give this one its own FP_DATABASE_URL, or run both "
            "in cluster mode (FP_REDIS_URL)"
        )
        self.holder = holder


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
    return True


class DatabaseHolder:
    def __init__(
        self,
        db: Database,
        instance_id: str,
        *,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        stale_after: float = STALE_AFTER_SECONDS,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        self._db = db
        self.instance_id = instance_id
        self.host = (host or socket.gethostname())[:255]
        self.pid = os.getpid() if pid is None else pid
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_after = stale_after
        self._token = secrets.token_hex(16)
        self.lost: str | None = None  # why this process no longer holds the database

    async def claim(self) -> None:
        """Hold the database, or raise ``DatabaseHeld`` naming who does."""
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                await self._claim_once()
                return
            except IntegrityError:  # another process inserted first: look again (its row refuses us)
                if attempt == CLAIM_ATTEMPTS:
                    raise

    async def _claim_once(self) -> None:
        async with self._db.engine.begin() as connection:
            found = await self._read(connection)
            if found is None:
                await connection.execute(insert(InstanceHolder).values(id=HOLDER_ROW, **self._claim_values()))
                return
            token, holder = found
            if not self._may_take(holder):
                raise DatabaseHeld(holder)
            taken = await connection.execute(
                update(InstanceHolder)
                .where(InstanceHolder.id == HOLDER_ROW, InstanceHolder.token == token)
                .values(**self._claim_values())
            )
            if taken.rowcount != 1:  # someone else took it between our read and write
                raise DatabaseHeld(holder)
        log.warning(
            "took over this database from instance %s (host %s, pid %d, heartbeat %.0f s ago)",
            holder.instance_id,
            holder.host,
            holder.pid,
            holder.heartbeat_age_seconds,
        )

    def _claim_values(self) -> dict[str, object]:
        return {
            "token": self._token,
            "instance_id": self.instance_id[:64],
            "host": self.host,
            "pid": self.pid,
            "started_at": utc_now(),
            "heartbeat_at": utc_now(),
        }

    @staticmethod
    async def _read(connection: AsyncConnection) -> tuple[str, Holder] | None:
        """The holder row (locked on MySQL until the claim commits) and its age on the database's clock."""
        row = (
            await connection.execute(
                select(
                    InstanceHolder.token,
                    InstanceHolder.instance_id,
                    InstanceHolder.host,
                    InstanceHolder.pid,
                    InstanceHolder.heartbeat_at,
                    utc_now(),
                )
                .where(InstanceHolder.id == HOLDER_ROW)
                .with_for_update()
            )
        ).first()
        if row is None:
            return None
        token, instance_id, host, pid, heartbeat_at, now = row
        age = (now.replace(tzinfo=UTC) - heartbeat_at).total_seconds()
        return token, Holder(instance_id, host, pid, max(0.0, age))

    def _may_take(self, holder: Holder) -> bool:
        if holder.heartbeat_age_seconds > self.stale_after:
            return True  # crashed or hung: nobody is writing these cards
        # This host's earlier process: gone (crashed, restarted at once), or this very pid (a container
        # restarted with the same hostname and pid 1, or an app built again in one process).
        return holder.host == self.host and (holder.pid == self.pid or not _pid_alive(holder.pid))

    async def heartbeat(self) -> bool:
        """Renew the heartbeat; False (and ``lost`` says why) when another process took the row."""
        async with self._db.engine.begin() as connection:
            renewed = await connection.execute(
                update(InstanceHolder)
                .where(InstanceHolder.id == HOLDER_ROW, InstanceHolder.token == self._token)
                .values(heartbeat_at=utc_now())
            )
        if renewed.rowcount == 1:
            return True
        if self.lost is None:
            self.lost = "another process took over this database (this one missed its heartbeats)"
            log.error("%s: stop this process; its cards are written by the other one", self.lost)
        return False

    async def run(self, stopper: Stopper) -> None:
        """Heartbeat until stopped or lost; a failed renewal is retried at the next beat."""
        while await stopper.pause(self.heartbeat_seconds):
            try:
                if not await self.heartbeat():
                    return
            except Exception as exc:  # the database is down: readiness says so; the row goes stale
                log.warning("database holder heartbeat failed: %s", type(exc).__name__)

    async def release(self) -> None:
        """Graceful stop: the next process need not wait for the heartbeat to go stale."""
        try:
            async with self._db.engine.begin() as connection:
                await connection.execute(
                    delete(InstanceHolder).where(
                        InstanceHolder.id == HOLDER_ROW, InstanceHolder.token == self._token
                    )
                )
        except Exception as exc:  # the row goes stale on its own
            log.warning("could not release the database holder row: %s", type(exc).__name__)
