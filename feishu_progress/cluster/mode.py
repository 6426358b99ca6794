"""Cluster mode (FP_REDIS_URL): several instances on one MySQL and one Redis, each card with one writer.

MySQL holds the truth: leases (cluster/lease.py), who writes which card and at which fence
(cluster/ownership.py), every task's saved state (saved before each 202 in this mode), the action log.
Redis holds what is shared and fast but never the only copy of anything: the app budget
(cluster/budget.py), callback dedupe keys, and nudges ("a click was recorded on task N") — every
nudge has a backstop (long-polls look at the table every second; a taken task replays the log).

What this object does, as the other rooms see it (each given it at construction, ``cluster/topology.py``):
- ``Ownership`` for the task service: may this instance write; take a task (claim); release finished ones.
- ``DeliveryGate`` for the scheduler: no write without a live lease; every write through the shared budget.
- ``RemoteClicks`` for ``cluster/clicks.py``: hand a click to the card's writer.
- its loops: the heartbeat, the takeover scan (each second: cards whose writer is gone, and batches
  others put in the event log for this instance's cards), the nudges.
- ``hand_over`` at a graceful stop: cards with nothing in flight are released for the others at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from feishu_progress.background import BackgroundTasks
from feishu_progress.cluster.budget import SharedBudget, connect
from feishu_progress.cluster.forward import Forwarder
from feishu_progress.cluster.lease import SAFETY_MARGIN_SECONDS, LeaseKeeper, end_stalled_transactions
from feishu_progress.cluster.limits import OpenApi
from feishu_progress.cluster.ownership import Ownership as Owner
from feishu_progress.cluster.ownership import OwnershipRepository, Taken
from feishu_progress.config import RateSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import EventLogRepository
from feishu_progress.errors import OwnedElsewhere
from feishu_progress.feishu.callback import CardActionEvent
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.progress.writer import DeliveryGate
from feishu_progress.runtime.service import Claim, TaskService
from feishu_progress.waiting import Stopper, event_or_timeout

log = logging.getLogger(__name__)
T = TypeVar("T")

# Cards of a dead writer are looked for this often: part of the worst card's takeover time.
TAKEOVER_SCAN_SECONDS = 0.5
# Taken cards load this many at a time (two queries each): a dead instance's 70 cards in a few round
# trips' time rather than 70 in a row, which took 10 s on a loaded database.
ADOPT_CONCURRENCY = 8
# Cards with logged batches caught up this many at a time, beside the scan (never holding it up).
CATCH_UP_CONCURRENCY = 4
NUDGE_CHANNEL = "fp:actions"
DEDUPE_PREFIX = "fp:callback"
REDIS_RETRY_SECONDS = 1.0
SCAN_NOW = "scan"  # a nudge: cards were handed over, look for orphans at once


class ClusterMode:
    def __init__(
        self, settings: Settings, db: Database, clock: Clock, metrics: Metrics, background: BackgroundTasks
    ) -> None:
        assert settings.redis_url is not None
        cluster = settings.cluster
        self.instance_id = settings.instance_id
        self._settings = settings
        self._clock = clock
        self._background = background
        self.metrics = metrics
        self._heartbeat_db = Database.open(db.url, pool_size=1, max_overflow=1)
        self.lease = LeaseKeeper(
            db, settings.instance_id, advertise_url(settings), cluster, clock, heartbeat_db=self._heartbeat_db
        )
        self.owners = OwnershipRepository(db, settings.instance_id)
        self.event_log = EventLogRepository(db)
        self.redis: aioredis.Redis = connect(settings.redis_url, 0.5)
        self._metrics = metrics
        self.budget = self._shared_budget(settings.feishu.app_id or "sandbox", settings.rate)
        self._app_gates: list[AppGate] = []
        self.forwarder = Forwarder(
            settings.instance_id,
            request_timeout=cluster.lease_seconds,  # a paused owner's lease runs out meanwhile
            click_timeout=cluster.forward_timeout_seconds,
        )
        self._redis_problem: str | None = None
        self._scan_now = asyncio.Event()
        self._order = UrgentFirst()  # the default app's budget (each other app's gate has its own)
        self._shares = OrphanShares(self.instance_id)
        self._catching_up: asyncio.Task[None] | None = None
        end_stalled_transactions(db, cluster.lease_seconds)

    def _shared_budget(self, app_id: str, rate: RateSettings) -> SharedBudget:
        assert self._settings.redis_url is not None
        return SharedBudget.from_url(
            self._settings.redis_url,
            app_id=app_id,  # the Redis keys are per app_id: each app has its own Open API budgets
            rate=rate,
            clock=self._clock,
            live_instances=self.lease.live_instances,
            metrics=self._metrics,
            probe_interval=REDIS_RETRY_SECONDS,  # back to one shared budget soon after Redis is
        )

    def gate_for(self, app_id: str | None, rate: RateSettings) -> DeliveryGate:
        """The scheduler gate of one app: this instance's lease and that app's shared budget."""
        if (app_id or "sandbox") == (self._settings.feishu.app_id or "sandbox"):
            return self
        gate = AppGate(self.lease, self._shared_budget(app_id or "sandbox", rate), self._background)
        self._app_gates.append(gate)
        return gate

    # -- lifecycle ----------------------------------------------------------------------------------

    # The task service is handed to each method that loads or drops its cards, never kept: the service
    # is built with this mode (its Ownership), so the mode cannot be built with the service.

    async def start(self, service: TaskService) -> int:
        """Take the lease, then this instance's own cards (after a restart) and any orphans."""
        await self.forwarder.open()
        await self.lease.acquire()
        mine = await self.owners.mine()
        return await self._adopt_all(service, mine) + await self._adopt_all(
            service, self._my_share(await self.owners.orphans())
        )

    def start_loops(self, stopper: Stopper, service: TaskService) -> None:
        async def lost() -> None:
            await self._lease_lost(service)

        self._background.spawn(self.lease.run(stopper, lost), name="cluster-heartbeat")
        self._background.spawn(self._scan(stopper, service), name="cluster-takeover")
        self._background.spawn(self._nudges(stopper, service), name="cluster-nudges")

    async def hand_over(self, in_flight: set[str], service: TaskService) -> int:
        """Graceful stop: release every card with no write in flight, then tell the others (drain).

        A card whose write is still in flight stays owned: the others take it as from a dead owner and
        wait out the write timeout before their first write, so the late write cannot land after theirs.
        """
        quiet = [t.session_id for t in service.registry if t.card.message_id not in in_flight]
        await self.owners.release(quiet)
        await self.lease.drain()
        await self._publish(SCAN_NOW)  # the others take them now, not at their next scan
        return len(quiet)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.lease.remove()
        await self._heartbeat_db.close()
        await self.forwarder.close()
        await self.budget.aclose()
        for gate in self._app_gates:
            await gate.budget.aclose()
        await self.redis.aclose()

    # -- Ownership (for the task service) -----------------------------------------------------------

    def may_write(self) -> bool:
        return self.lease.can_write()

    async def claim(self, session_id: int) -> Claim | None:
        """This instance writes the task from now on (a Claim), or OwnedElsewhere; None: no such task."""
        for _ in range(2):  # a lost race for an orphan is followed by one look at the winner
            seen = await self.owners.of(session_id)
            if seen is None:
                return None
            if seen.owner == self.instance_id:
                return Claim(seen.fence)
            if seen.owner is not None and seen.owner_alive:
                peer = await self.lease.peer(seen.owner)
                raise OwnedElsewhere(session_id, seen.owner, peer.address)
            taken = await self.owners.take_many([seen])  # a row a paused instance locked: not waited for
            if taken:
                return self._claim_of(taken[0], self._clock.monotonic())
        raise OwnedElsewhere(session_id, "another instance", None)

    def release_later(self, session_ids: Sequence[int]) -> None:
        self._background.spawn(self.owners.release(list(session_ids)), name="cluster-release")

    def _claim_of(self, taken: Taken, taken_at: float) -> Claim:
        """A dead owner stopped starting writes SAFETY_MARGIN before its lease ran out, and each write
        times out after write_timeout: the new owner's first write waits out only what is left of that,
        counted from ``taken_at`` (when the take returned), not from when the card is loaded."""
        if not taken.from_dead_owner:
            return Claim(taken.fence, fence_moved=True)
        in_flight_until = self._settings.cluster.write_timeout_seconds - SAFETY_MARGIN_SECONDS
        left = in_flight_until - taken.expired_for
        return Claim(taken.fence, taken_at + left if left > 0 else 0.0, fence_moved=True)

    # -- DeliveryGate (for the scheduler) -----------------------------------------------------------

    async def enter(self, api: str, *, urgent: bool) -> object | None:
        return await _enter(self.lease, self.budget, api, urgent, self._order)

    def leave(self, grant: object) -> None:
        self.budget.settle(grant)  # type: ignore[arg-type]

    def paused(self, api: str, seconds: float) -> None:
        self._background.spawn(self.budget.pause(OpenApi(api), seconds), name="cluster-budget-pause")

    # -- RemoteClicks (for cluster/clicks.py) -------------------------------------------------------

    async def click(self, address: str, event: CardActionEvent) -> Mapping[str, Any]:
        secret = self._settings.cluster.secret
        assert secret is not None  # Settings.serving_problems: cluster mode does not start without it
        return await self.forwarder.click(address, event, secret.get_secret_value(), self._clock.wall())

    # -- callback dedupe across instances -----------------------------------------------------------

    async def first_seen(self, key: str, ttl_seconds: int) -> bool | None:
        """True the first time any instance sees ``key``; None when Redis cannot say (use the database)."""
        try:
            return bool(await self.redis.set(f"{DEDUPE_PREFIX}:{key}", 1, nx=True, ex=ttl_seconds))
        except (RedisError, OSError, TimeoutError) as exc:
            self._redis_down(exc)
            return None

    # -- nudges -------------------------------------------------------------------------------------

    def nudge(self, session_id: int) -> None:
        """A click was recorded here: wake the others' long-polls and the card's writer."""
        self._background.spawn(self._publish(str(session_id)), name="cluster-nudge")

    async def _publish(self, nudge: str) -> None:
        try:
            await self.redis.publish(NUDGE_CHANNEL, nudge)
        except (RedisError, OSError, TimeoutError) as exc:  # the 1 s backstops still see it
            self._redis_down(exc)

    async def _nudges(self, stopper: Stopper, service: TaskService) -> None:
        while not stopper.stopping:
            try:
                await self._listen(stopper, service)
            except (RedisError, OSError, TimeoutError) as exc:
                self._redis_down(exc)
            await stopper.pause(REDIS_RETRY_SECONDS)

    async def _listen(self, stopper: Stopper, service: TaskService) -> None:
        async with self.redis.pubsub() as pubsub:
            await pubsub.subscribe(NUDGE_CHANNEL)
            self._redis_problem = None
            while not stopper.stopping:
                nudge = _nudge_text(await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0))
                if nudge == SCAN_NOW:
                    self._scan_now.set()
                elif nudge.isdigit() and len(nudge) <= 18:
                    self._nudged(service, int(nudge))

    def _nudged(self, service: TaskService, session_id: int) -> None:
        service.action_log.notify(session_id)
        if service.registry.get(session_id) is not None:
            self._background.spawn(service.replay_actions(session_id), name="cluster-replay")

    def redis_problem(self) -> str | None:
        """Why Redis is out of reach (the budget then spends a local share), or None."""
        budget = self.budget.status()
        if budget.mode.value != "shared":
            return f"redis unreachable: {budget.reason}; spending budget ÷ {self.lease.live_instances()}"
        return self._redis_problem

    def _redis_down(self, exc: BaseException) -> None:
        if self._redis_problem is None:
            log.warning("redis unreachable (%s): nudges wait for the 1 s backstops", type(exc).__name__)
        self._redis_problem = f"redis unreachable: {type(exc).__name__}"

    # -- takeover -----------------------------------------------------------------------------------

    async def _scan(self, stopper: Stopper, service: TaskService) -> None:
        while not stopper.stopping:
            await event_or_timeout(self._scan_now, self._clock, TAKEOVER_SCAN_SECONDS)
            self._scan_now.clear()
            if stopper.stopping or not self.lease.can_write():
                continue
            try:
                taken = await self.owners.take_many(self._my_share(await self.owners.orphans()))
            except Exception:  # the next scan tries again
                log.exception("takeover scan failed")
                taken = []
            if taken:  # loaded beside the scan: the next one may find more orphans meanwhile
                self._background.spawn(self._adopt(service, taken), name="cluster-adopt")
            # Beside the scan, never in its way: catching up a busy card waits for its lock and the
            # database, and a scan held up by it once found a dead instance's cards 8 s late.
            if self._catching_up is None or self._catching_up.done():
                catch_up = self._catch_up_logged(service)
                self._catching_up = self._background.spawn(catch_up, name="cluster-catch-up")

    async def _catch_up_logged(self, service: TaskService) -> None:
        """Apply batches others logged for this instance's cards (the backstop to a lost nudge)."""
        try:
            pending = await self.event_log.pending_for(self.instance_id)
        except Exception:  # the next scan tries again
            log.exception("looking for logged batches failed")
            return
        # Not held: being loaded (which applies them) or finished and evicted (the next batch that loads
        # it applies them first). Loading it here would race that load for the fence.
        behind = [
            session_id
            for session_id, newest in pending.items()
            if (task := service.registry.get(session_id)) is not None and task.state.events_applied < newest
        ]
        await _each(behind, service.replay_actions, CATCH_UP_CONCURRENCY)

    def _my_share(self, orphans: Sequence[Owner]) -> list[Owner]:
        return self._shares.mine(orphans, self.lease.live_ids)

    async def _adopt_all(self, service: TaskService, seen: Sequence[Owner]) -> int:
        """Take ``seen`` in one statement and hold them; how many are held now."""
        return await self._adopt(service, await self.owners.take_many(seen))

    async def _adopt(self, service: TaskService, taken: Sequence[Taken]) -> int:
        """Load cards this instance took, a few at a time; how many are held now."""
        adopted = 0
        taken_at = self._clock.monotonic()  # a card loaded late (8 at a time) has waited meanwhile

        async def adopt(card: Taken) -> None:
            nonlocal adopted
            if await service.adopt(card.session_id, self._claim_of(card, taken_at)) is not None:
                adopted += 1

        await _each(taken, adopt, ADOPT_CONCURRENCY)
        if adopted:
            log.info("took over %d card(s)", adopted)
        return adopted

    async def _lease_lost(self, service: TaskService) -> None:
        """This instance was paused or cut off past its lease: its cards may be someone else's now."""
        held = [task.session_id for task in service.registry]
        service.drop_local(held)
        await self._adopt_all(service, await self.owners.mine())  # the ones nobody took meanwhile


def _nudge_text(message: Mapping[str, Any] | None) -> str:
    """What a nudge says (a task id, or SCAN_NOW); "" for no message or anything unreadable."""
    data = None if message is None else message.get("data")
    if isinstance(data, bytes):
        data = data.decode("ascii", "replace")
    return data if isinstance(data, str) and data.isascii() else ""


def advertise_url(settings: Settings) -> str:
    """How peers reach this instance's public listener."""
    if settings.cluster.advertise_url:
        return settings.cluster.advertise_url
    import socket

    host = settings.bind_host if settings.bind_host not in ("0.0.0.0", "::") else socket.gethostname()
    return f"http://{host}:{settings.http.port}"


__all__ = ["ClusterMode", "advertise_url"]


def drawn(live: Iterable[str], session_id: int) -> str:
    """The live instance that takes an orphan: the highest hash of (instance, card). Every instance
    computes the same, so each card has one taker and a dead instance's cards spread evenly."""
    return max(live, key=lambda instance: zlib.crc32(f"{instance}:{session_id}".encode()))


class OrphanShares:
    """Which orphans this instance takes at a scan: those drawn for it among the live instances, and any
    drawn for another at the last scan that it has not taken since (an overloaded peer delays a card one
    scan at most). The live instances take different cards at once instead of racing for the same ones
    in the same order."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._left: set[int] = set()  # orphans the last scan left to the other instances

    def mine(self, orphans: Sequence[Owner], live_ids: Iterable[str]) -> list[Owner]:
        gone = {orphan.owner for orphan in orphans}  # an orphan's owner is not live, whatever was counted
        live = sorted({*live_ids, self.instance_id} - gone)
        mine, left = [], set()
        for orphan in orphans:
            if orphan.session_id in self._left or drawn(live, orphan.session_id) == self.instance_id:
                mine.append(orphan)
            else:
                left.add(orphan.session_id)
        self._left = left
        return mine


async def _each(items: Sequence[T], work: Callable[[T], Awaitable[None]], concurrency: int) -> None:
    """``work`` on every item, ``concurrency`` at a time; one item's failure is logged, not spread."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: T) -> None:
        async with gate:
            try:
                await work(item)
            except Exception:
                log.exception("cluster work on %s failed", item)

    await asyncio.gather(*(one(item) for item in items))


class UrgentFirst:
    """Within this instance, an ordinary call of an API waits while an urgent one waits for that API.

    The shared budget polls: every waiting call tries again when its wait is over, so a final, a click
    or the first write of a card just taken over competed on equal terms with the dozens of ordinary
    updates waiting beside it (one such first write waited 6.6 s for a grant after a takeover).
    """

    def __init__(self) -> None:
        self._urgent: Counter[str] = Counter()
        self._clear: dict[str, asyncio.Event] = {}

    @contextlib.asynccontextmanager
    async def turn(self, api: str, *, urgent: bool) -> AsyncIterator[None]:
        clear = self._clear.setdefault(api, asyncio.Event())
        if not urgent:
            while self._urgent[api]:
                await clear.wait()
            yield
            return
        self._urgent[api] += 1
        clear.clear()
        try:
            yield
        finally:
            self._urgent[api] -= 1
            if not self._urgent[api]:
                clear.set()


async def _enter(
    lease: LeaseKeeper, budget: SharedBudget, api: str, urgent: bool, order: UrgentFirst
) -> object | None:
    if not lease.can_write():
        return None
    async with order.turn(api, urgent=urgent):
        if not lease.can_write():  # an ordinary call may have waited for the urgent ones
            return None
        grant = await budget.acquire(OpenApi(api), urgent=urgent)
    if not lease.can_write():  # the wait for the budget outlasted the lease
        budget.settle(grant)
        return None
    return grant


class AppGate:
    """The DeliveryGate of an app other than the default: the same lease, the app's own shared budget."""

    def __init__(self, lease: LeaseKeeper, budget: SharedBudget, background: BackgroundTasks) -> None:
        self._lease = lease
        self.budget = budget
        self._background = background
        self._order = UrgentFirst()

    async def enter(self, api: str, *, urgent: bool) -> object | None:
        return await _enter(self._lease, self.budget, api, urgent, self._order)

    def leave(self, grant: object) -> None:
        self.budget.settle(grant)  # type: ignore[arg-type]

    def paused(self, api: str, seconds: float) -> None:
        self._background.spawn(self.budget.pause(OpenApi(api), seconds), name="cluster-budget-pause")
