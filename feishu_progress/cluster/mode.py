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
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from feishu_progress.background import BackgroundTasks
from feishu_progress.cluster.budget import SharedBudget, connect
from feishu_progress.cluster.forward import Forwarder
from feishu_progress.cluster.lease import SAFETY_MARGIN_SECONDS, LeaseKeeper
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
from feishu_progress.progress.scheduler import DeliveryGate
from feishu_progress.runtime.service import Claim, TaskService
from feishu_progress.waiting import Stopper, event_or_timeout

log = logging.getLogger(__name__)

# Cards of a dead writer are looked for this often: part of the worst card's takeover time.
TAKEOVER_SCAN_SECONDS = 0.5
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
        self.lease = LeaseKeeper(db, settings.instance_id, advertise_url(settings), cluster, clock)
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
        self.service: TaskService | None = None
        self._redis_problem: str | None = None
        self._scan_now = asyncio.Event()

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

    async def start(self, service: TaskService) -> int:
        """Take the lease, then this instance's own cards (after a restart) and any orphans."""
        self.service = service
        await self.forwarder.open()
        await self.lease.acquire()
        mine = await self.owners.mine()
        return await self._adopt_all(mine) + await self._adopt_all(await self.owners.orphans())

    def start_loops(self, stopper: Stopper) -> None:
        self._background.spawn(self.lease.run(stopper, self._lease_lost), name="cluster-heartbeat")
        self._background.spawn(self._scan(stopper), name="cluster-takeover")
        self._background.spawn(self._nudges(stopper), name="cluster-nudges")

    async def hand_over(self, in_flight: set[str]) -> int:
        """Graceful stop: release every card with no write in flight, then tell the others (drain).

        A card whose write is still in flight stays owned: the others take it as from a dead owner and
        wait out the write timeout before their first write, so the late write cannot land after theirs.
        """
        assert self.service is not None
        quiet = [t.session_id for t in self.service.registry if t.card.message_id not in in_flight]
        await self.owners.release(quiet)
        await self.lease.drain()
        await self._publish(SCAN_NOW)  # the others take them now, not at their next scan
        return len(quiet)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.lease.remove()
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
            taken = await self.owners.take(seen)
            if taken is not None:
                return self._claim_of(taken)
        raise OwnedElsewhere(session_id, "another instance", None)

    def release_later(self, session_ids: Sequence[int]) -> None:
        self._background.spawn(self.owners.release(list(session_ids)), name="cluster-release")

    def _claim_of(self, taken: Taken) -> Claim:
        """A dead owner stopped starting writes SAFETY_MARGIN before its lease ran out, and each write
        times out after write_timeout: the new owner's first write waits out only what is left of that."""
        if not taken.from_dead_owner:
            return Claim(taken.fence)
        in_flight_until = self._settings.cluster.write_timeout_seconds - SAFETY_MARGIN_SECONDS
        return Claim(taken.fence, max(0.0, in_flight_until - taken.expired_for))

    # -- DeliveryGate (for the scheduler) -----------------------------------------------------------

    async def enter(self, api: str, *, urgent: bool) -> object | None:
        return await _enter(self.lease, self.budget, api, urgent)

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

    async def _nudges(self, stopper: Stopper) -> None:
        while not stopper.stopping:
            try:
                await self._listen(stopper)
            except (RedisError, OSError, TimeoutError) as exc:
                self._redis_down(exc)
            await stopper.pause(REDIS_RETRY_SECONDS)

    async def _listen(self, stopper: Stopper) -> None:
        assert self.service is not None
        async with self.redis.pubsub() as pubsub:
            await pubsub.subscribe(NUDGE_CHANNEL)
            self._redis_problem = None
            while not stopper.stopping:
                nudge = _nudge_text(await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0))
                if nudge == SCAN_NOW:
                    self._scan_now.set()
                elif nudge.isdigit() and len(nudge) <= 18:
                    self._nudged(int(nudge))

    def _nudged(self, session_id: int) -> None:
        assert self.service is not None
        self.service.action_log.notify(session_id)
        if self.service.registry.get(session_id) is not None:
            self._background.spawn(self.service.replay_actions(session_id), name="cluster-replay")

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

    async def _scan(self, stopper: Stopper) -> None:
        while not stopper.stopping:
            await event_or_timeout(self._scan_now, self._clock, TAKEOVER_SCAN_SECONDS)
            self._scan_now.clear()
            if stopper.stopping or not self.lease.can_write():
                continue
            try:
                await self._adopt_all(await self.owners.orphans())
                await self._catch_up_logged()
            except Exception:  # the next scan tries again
                log.exception("takeover scan failed")

    async def _catch_up_logged(self) -> None:
        """Apply batches others logged for this instance's cards (the backstop to a lost nudge)."""
        assert self.service is not None
        for session_id, newest in (await self.event_log.pending_for(self.instance_id)).items():
            task = self.service.registry.get(session_id)
            # Not held: being loaded (which applies them) or finished and evicted (the next batch that
            # loads it applies them first). Loading it here would race that load for the fence.
            if task is not None and task.state.events_applied < newest:
                await self.service.replay_actions(session_id)

    async def _adopt_all(self, seen: Sequence[Owner]) -> int:
        assert self.service is not None
        adopted = 0
        for owner in seen:
            taken = await self.owners.take(owner)
            if taken is None:
                continue
            if await self.service.adopt(taken.session_id, self._claim_of(taken)) is not None:
                adopted += 1
        if adopted:
            log.info("took over %d card(s)", adopted)
        return adopted

    async def _lease_lost(self) -> None:
        """This instance was paused or cut off past its lease: its cards may be someone else's now."""
        assert self.service is not None
        held = [task.session_id for task in self.service.registry]
        self.service.drop_local(held)
        await self._adopt_all(await self.owners.mine())  # the ones nobody took meanwhile


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


async def _enter(lease: LeaseKeeper, budget: SharedBudget, api: str, urgent: bool) -> object | None:
    if not lease.can_write():
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

    async def enter(self, api: str, *, urgent: bool) -> object | None:
        return await _enter(self._lease, self.budget, api, urgent)

    def leave(self, grant: object) -> None:
        self.budget.settle(grant)  # type: ignore[arg-type]

    def paused(self, api: str, seconds: float) -> None:
        self._background.spawn(self.budget.pause(OpenApi(api), seconds), name="cluster-budget-pause")
