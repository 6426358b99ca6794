"""The app budget shared by every instance through Redis, with a local fallback when Redis is out of reach.

Feishu's budget is per app and per API (``OpenApi``): the SUM of every instance's calls of one API must stay
within that API's budget in the one table (``RateSettings.for_api``: its own limit, capped by
FP_RATE__APP_PER_SECOND and FP_RATE__APP_PER_MINUTE) — the same table a single instance spends. Each
decision is one Lua script on Redis (``scripts.TAKE``): it honours the shared ``blocked_until`` written
by ``pause`` and checks both GCRA windows on Redis's clock, writing both only when both allow. Per-card
pacing and fairness stay in each instance's scheduler; this class only says "go" or "wait this long".

Use (from the task that is about to call the API, before building the request)::

    grant = await budget.acquire(OpenApi.PATCH, urgent=is_final_or_click)
    try:
        ...send...
    finally:
        budget.settle(grant)           # or: await budget.refund(grant) when it was surely NOT sent

When Redis errors or does not answer within ``timeout`` seconds, the budget switches to a local share
(the budget ÷ ``live_instances()``), logs once, reports ``local-fallback`` with the reason (``status``,
the ``fp_budget_mode`` gauge), and probes Redis every ``probe_interval`` seconds to switch back. The
local share is ``progress/rate_budget.py``'s ``AppBudget`` (exact windows held until the answer). It also
counts this instance's grants while Redis works, so a switch starts from what this instance really
spent.

The two switches are where the sum could overrun, so each has a rule:
- **to the local share**: what the OTHER instances were granted just before Redis went away is unknown,
  so nothing is granted for one short window (+ the arrival jitter) after the switch ("quiet"); after
  that every grant in a per-second window is a local one, and the local shares add up to the budget.
- **back to shared** (Redis may have restarted empty): for one probe interval + one short window after
  the switch a grant needs the local share AND the shared budget ("both"). Every instance probes on the
  same interval, so by the end of that time no instance is still spending a share Redis cannot see,
  and the local grants before it have left the window.
The per-minute window cannot be protected this way without a minute of silence: right after a Redis
outage the per-minute sum may overrun once when the cluster spent at that cap just before; Feishu's 429
then pauses every instance as usual (the outage is visible in ``/readyz`` meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from feishu_progress.cluster import scripts
from feishu_progress.cluster.limits import (
    LATE_CALL_APIS,
    BudgetWindows,
    GcraWindow,
    OpenApi,
    SharedBudgetTuning,
)
from feishu_progress.config import RateSettings
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.progress.rate_budget import AppBudget

log = logging.getLogger(__name__)

# What "Redis did not work" looks like: its own errors, socket errors, and our timeout.
_REDIS_FAILURES = (RedisError, OSError, TimeoutError)
_MICROS = 1_000_000


class BudgetMode(StrEnum):
    SHARED = "shared"  # every decision made by the Redis script
    LOCAL_FALLBACK = "local-fallback"  # Redis out of reach: this instance's share, decided locally


@dataclass(frozen=True, slots=True)
class Grant:
    """Permission for one Open API call; hand it back to ``settle`` (or ``refund``) when the call is over."""

    api: OpenApi
    urgent: bool
    mode: BudgetMode
    server_time: float | None  # Redis TIME of the grant in seconds (shared mode), None in local fallback
    redis_tats: tuple[str, str] | None = field(default=None, repr=False)  # what the grant wrote (refund)
    local_share: AppBudget | None = field(default=None, repr=False)  # the local share that counted it


@dataclass(frozen=True, slots=True)
class Attempt:
    """One non-waiting decision: a grant, or how many seconds to wait before asking again."""

    wait: float  # 0.0 when granted
    grant: Grant | None = None


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """What /readyz and the admin pages show about the budget."""

    mode: BudgetMode
    reason: str  # why the local fallback is in force ('' when shared)
    since: float  # clock monotonic time of the last switch

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode.value, "reason": self.reason}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def connect(url: str, timeout: float) -> aioredis.Redis:
    """A client for the delivery path: short socket timeouts, one immediate retry on a new connection.

    The retry is for a pooled connection Redis closed (after a Redis restart every pooled connection
    fails once): falling back for that alone would put one instance on its local share while the
    others still spend the shared budget — and the local share is only safe when all fall back
    together. A Redis that is really gone fails the retry too (within the same timeout).
    """
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
    )


class _LocalShares:
    """One ``AppBudget`` per API at the budget ÷ live instances, resized when that number changes.

    Resized in place, never replaced: the share holds the calls this instance made in the last window
    (and the grants still out settle into it). A fresh share would start empty, so when a paused or
    dead peer's lease expired during an outage, each instance could spend a whole window of its new
    share on top of what the gateway had just counted from its old one.
    """

    def __init__(
        self, rate: RateSettings, tuning: SharedBudgetTuning, live_instances: Callable[[], int]
    ) -> None:
        self._rate = rate
        self._tuning = tuning
        self._live_instances = live_instances
        self._instances = 1
        self._shares: dict[OpenApi, tuple[int, AppBudget]] = {}

    def instances(self) -> int:
        """The live instances as last seen (a failing callable keeps the last answer)."""
        try:
            self._instances = max(1, int(self._live_instances()))
        except Exception:
            log.exception("live_instances() failed; keeping %d", self._instances)
        return self._instances

    def get(self, api: OpenApi, now: float) -> AppBudget:
        instances = self.instances()
        known = self._shares.get(api)
        if known is not None and known[0] == instances:
            return known[1]
        rate = self._tuning.local_share(self._rate.for_api(api.value), instances)
        if known is None:
            share = AppBudget(rate, now)
        else:
            share = known[1]
            share.resize(rate, now)  # its counted calls and its pause stay
        self._shares[api] = (instances, share)
        return share


class SharedBudget:
    """The per-(app, API) budget every instance spends together; see the module docstring."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        app_id: str,
        rate: RateSettings,
        clock: Clock,
        tuning: SharedBudgetTuning | None = None,
        live_instances: Callable[[], int] = lambda: 1,
        metrics: Metrics | None = None,
        timeout: float = 0.2,
        probe_interval: float = 3.0,
        max_sleep: float = 1.0,
        key_prefix: str = "fp:budget",
        server_time: Callable[[], float] | None = None,
    ) -> None:
        """``live_instances`` must be cheap (a cached count); ``server_time`` replaces Redis TIME (tests)."""
        self._client = client
        self._app_id = app_id
        self._clock = clock
        self._tuning = tuning if tuning is not None else SharedBudgetTuning()
        # Each API's own windows, from the one budget table (FP_RATE__API__*, capped by FP_RATE__APP_PER_*).
        self._windows = {
            api: self._tuning.windows(rate.for_api(api.value), late_calls=api in LATE_CALL_APIS)
            for api in OpenApi
        }
        self._local = _LocalShares(rate, self._tuning, live_instances)
        self._metrics = metrics if metrics is not None else Metrics()
        self._timeout = timeout
        self._probe_interval = probe_interval
        self._max_sleep = max_sleep
        self._key_prefix = key_prefix
        self._server_time = server_time
        self._take = client.register_script(scripts.TAKE)
        self._pause = client.register_script(scripts.PAUSE)
        self._refund = client.register_script(scripts.REFUND)
        self._status = BudgetStatus(BudgetMode.SHARED, "", clock.monotonic())
        self._quiet_until = float("-inf")  # local share: nothing granted before (see module docstring)
        self._both_until = float("-inf")  # shared again: a grant needs the local share too until then
        self._prober: asyncio.Task[None] | None = None
        self._show_mode()

    @classmethod
    def from_url(cls, url: str, *, timeout: float = 0.2, **kwargs: Any) -> SharedBudget:
        """A budget on its own Redis client (FP_REDIS_URL); ``aclose`` closes the client."""
        return cls(connect(url, timeout), timeout=timeout, **kwargs)

    # -- state ------------------------------------------------------------------------------------

    @property
    def windows(self) -> BudgetWindows:
        """The message PATCH API's GCRA windows (``windows_of`` for another API)."""
        return self._windows[OpenApi.PATCH]

    def windows_of(self, api: OpenApi) -> BudgetWindows:
        """``api``'s GCRA windows, derived from its budget in the rate settings and the tuning."""
        return self._windows[api]

    @property
    def mode(self) -> BudgetMode:
        return self._status.mode

    def status(self) -> BudgetStatus:
        """The mode in force and why (/readyz: local-fallback still delivers, at a share)."""
        return self._status

    def key(self, api: OpenApi) -> str:
        """The Redis key of one (app, API) budget."""
        return f"{self._key_prefix}:{self._app_id}:{api.value}"

    async def aclose(self) -> None:
        """Stop probing and close the Redis client."""
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
            self._prober = None
        await self._client.aclose()

    # -- spending ---------------------------------------------------------------------------------

    async def acquire(self, api: OpenApi, *, urgent: bool = False) -> Grant:
        """Wait (on the injected clock) until one call of ``api`` is granted; never raises for Redis."""
        while True:
            attempt = await self.try_acquire(api, urgent=urgent)
            if attempt.grant is not None:
                return attempt.grant
            # Capped so that a wait decided in one mode is looked at again soon after a switch.
            await self._clock.sleep(min(attempt.wait, self._max_sleep))

    async def try_acquire(self, api: OpenApi, *, urgent: bool = False) -> Attempt:
        """Grant one call of ``api`` now, or say how long to wait (``Attempt.wait``); never waits itself."""
        started = time.perf_counter()
        if self._status.mode is BudgetMode.SHARED:
            try:
                attempt = await self._try_shared_after_local(api, urgent)
            except _REDIS_FAILURES as exc:
                self._fall_back(exc)
                attempt = self._try_local(api, urgent)
        else:
            attempt = self._try_local(api, urgent)
        mode = attempt.grant.mode if attempt.grant is not None else self._status.mode
        self._metrics.budget_acquire_seconds.labels(mode=mode.value).observe(time.perf_counter() - started)
        counter = self._metrics.budget_grants if attempt.grant is not None else self._metrics.budget_waits
        counter.labels(api=api.value, mode=mode.value).inc()
        return attempt

    def settle(self, grant: Grant) -> None:
        """The call of ``grant`` ended (answered, failed, or cancelled after it may have been sent).

        Shared mode needs nothing (the windows count from the grant, with headroom for the arrival);
        the local share holds its slot until one window after this.
        """
        if grant.local_share is not None:
            grant.local_share.settle(self._clock.monotonic())

    async def refund(self, grant: Grant) -> bool:
        """Give a grant back INSTEAD of ``settle``, only when the call was surely not sent.

        "Surely" means the request never left this process: the card could not be built, the call was
        cancelled before the connection was opened, the client refused it locally. A timeout, a reset
        connection or any answer from Feishu are NOT such cases: Feishu may have counted the call.
        Redis takes it back only while the grant is still the newest of its budget (otherwise the slot
        is lost, which is safe). True when the shared budget took it back.
        """
        self.settle(grant)  # the local share cannot un-count: its slot frees one window from now
        if grant.redis_tats is None or self._status.mode is not BudgetMode.SHARED:
            return False
        short, long = self._windows[grant.api].short, self._windows[grant.api].long
        args: list[int | str] = [*grant.redis_tats, short.interval_us, long.interval_us]
        try:
            reply = await self._redis_call(self._refund, grant.api, args)
        except _REDIS_FAILURES as exc:
            self._fall_back(exc)
            return False
        return int(reply) == 1

    async def pause(self, api: OpenApi, seconds: float) -> None:
        """Stop every instance's calls of ``api`` for ``seconds`` (a 429's ``x-ogw-ratelimit-reset``)."""
        self._local.get(api, self._clock.monotonic()).pause_until(self._clock.monotonic() + seconds)
        if self._status.mode is not BudgetMode.SHARED:
            return
        args: list[int | str] = [max(0, round(seconds * _MICROS)), self._now_argument()]
        try:
            await self._redis_call(self._pause, api, args)
        except _REDIS_FAILURES as exc:
            self._fall_back(exc)

    # -- shared mode ------------------------------------------------------------------------------

    async def _try_shared_after_local(self, api: OpenApi, urgent: bool) -> Attempt:
        """Shared mode; just after a return from the local share, the local share must agree first."""
        now = self._clock.monotonic()
        if now >= self._both_until:
            return await self._try_shared(api, urgent)
        share = self._local.get(api, now)
        if not share.try_take(now):  # (a slot the shared budget then refuses is lost: safe)
            return Attempt(wait=max(share.next_available(now) - now, 0.0))
        attempt = await self._try_shared(api, urgent, counted=share)
        if attempt.grant is None:
            share.settle(self._clock.monotonic())
        return attempt

    async def _try_shared(self, api: OpenApi, urgent: bool, counted: AppBudget | None = None) -> Attempt:
        short, long = self._windows[api].short, self._windows[api].long
        args: list[int | str] = [
            short.interval_us,
            _tolerance(short, urgent),
            long.interval_us,
            _tolerance(long, urgent),
            self._now_argument(),
        ]
        reply = await self._redis_call(self._take, api, args)
        if int(reply[0]) != 1:
            return Attempt(wait=int(reply[1]) / _MICROS)
        if counted is None:
            # Counted in the local share too (when it has room), so a switch to it starts from the truth.
            share = self._local.get(api, self._clock.monotonic())
            counted = share if share.try_take(self._clock.monotonic()) else None
        grant = Grant(
            api=api,
            urgent=urgent,
            mode=BudgetMode.SHARED,
            server_time=int(reply[2]) / _MICROS,
            redis_tats=(_text(reply[3]), _text(reply[4])),
            local_share=counted,
        )
        return Attempt(wait=0.0, grant=grant)

    async def _redis_call(self, script: Any, api: OpenApi, args: Sequence[int | str]) -> Any:
        async with asyncio.timeout(self._timeout):
            return await script(keys=[self.key(api)], args=list(args))

    def _now_argument(self) -> int | str:
        return "" if self._server_time is None else round(self._server_time() * _MICROS)

    # -- local fallback ---------------------------------------------------------------------------

    def _try_local(self, api: OpenApi, urgent: bool) -> Attempt:
        now = self._clock.monotonic()
        if now < self._quiet_until:
            return Attempt(wait=self._quiet_until - now)
        share = self._local.get(api, now)
        if share.try_take(now):
            grant = Grant(
                api=api, urgent=urgent, mode=BudgetMode.LOCAL_FALLBACK, server_time=None, local_share=share
            )
            return Attempt(wait=0.0, grant=grant)
        return Attempt(wait=max(share.next_available(now) - now, 0.0))

    def _fall_back(self, exc: BaseException) -> None:
        if self._status.mode is BudgetMode.LOCAL_FALLBACK:
            return
        reason = f"Redis failed: {type(exc).__name__}: {exc}"[:200] if str(exc) else type(exc).__name__
        now = self._clock.monotonic()
        self._status = BudgetStatus(BudgetMode.LOCAL_FALLBACK, reason, now)
        self._quiet_until = now + self._one_short_window()
        self._metrics.budget_fallbacks.inc()
        self._show_mode()
        log.warning(
            "shared budget: %s; spending this instance's share (1/%d of the budget) until Redis answers",
            reason,
            self._local.instances(),
        )
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_until_back(), name="fp-budget-redis-probe")

    async def _probe_until_back(self) -> None:
        while True:
            await self._clock.sleep(self._probe_interval)
            try:
                async with asyncio.timeout(self._timeout):
                    await self._client.ping()
            except _REDIS_FAILURES as exc:
                log.debug("shared budget: Redis still out of reach (%s)", exc)
                continue
            now = self._clock.monotonic()
            self._status = BudgetStatus(BudgetMode.SHARED, "", now)
            self._both_until = now + self._probe_interval + self._timeout + self._one_short_window()
            self._show_mode()
            log.info("shared budget: Redis answers again; back to the shared budget")
            return

    def _one_short_window(self) -> float:
        """How long a grant counts in the per-second window, arrival jitter included."""
        return self._tuning.short_window + self._tuning.arrival_jitter

    def _show_mode(self) -> None:
        for mode in BudgetMode:
            self._metrics.budget_mode.labels(mode=mode.value).set(1 if mode is self._status.mode else 0)


def _tolerance(window: GcraWindow, urgent: bool) -> int:
    """How far ahead of now the window's TAT may run: the whole burst for urgent calls, less otherwise."""
    return (window.burst if urgent else window.ordinary_burst) * window.interval_us
