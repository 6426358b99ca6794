"""Calls that are not card writes, within their Open API's app budget: a first card's send or reply, a
card entity's create, an image upload, a tenant token.

They share the app's ``BudgetTable`` with the scheduler's card writes (a burst of new tasks must not meet
Feishu's limit either) and go ahead of card updates (urgent). A caller that must answer someone (a
``POST /v1/tasks``) waits at most its bound: past it — or at once when the callers queued for that API
cannot all be served in time — ``BudgetBusy`` tells when to try again, from the budget's sustained rate
and the queue.

A create's bound runs from its arrival, not from its first budget wait: ``creating`` counts it from the
moment it comes in, and refuses it at the door — before any database work — when the creates already
in progress could not all be served within the bound. Measured (bench/creates.py, 500 creates in
flight on SQLite): without the door every one did its reads and writes first, the pool queued them for
seconds, and a request took three times its bound although none waited past it for the budget.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from feishu_progress.errors import FeishuProgressError
from feishu_progress.ports import Clock
from feishu_progress.progress.rate_budget import AppBudget, BudgetTable
from feishu_progress.progress.writer import DeliveryGate

# Never spin: a wait already due (or missed by a rounding error) still sleeps this long.
_MIN_SLEEP = 0.001
# A caller whose budget is all held by calls still out looks again this often (``next_available`` is
# ``inf`` until one of them ends, and nothing wakes the caller then).
_POLL = 0.05


class BudgetBusy(FeishuProgressError):
    """A call (not a card write) would wait for its API's budget past its bound."""

    def __init__(self, api: str, retry_after: int) -> None:
        super().__init__(f"the {api} budget is busy: try again in {retry_after} s")
        self.api = api
        self.retry_after = retry_after


class Admission:
    """One app's calls that are not card writes, each within its API's budget (and the cluster's gate)."""

    def __init__(self, budgets: BudgetTable, *, clock: Clock, gate: DeliveryGate | None = None) -> None:
        self._budgets = budgets
        self._clock = clock
        self._gate = gate
        self._queued: dict[str, int] = {}  # callers waiting, by API
        self._creating: dict[str, int] = {}  # creates in progress, by the first API they call

    @asynccontextmanager
    async def creating(self, api: str, *, max_wait: float) -> AsyncIterator[float]:
        """One create, from its arrival to its answer, whose first call is ``api``: yields its deadline
        (``max_wait`` from now); ``BudgetBusy`` at once when the creates in progress could not all have
        their turn of ``api`` within ``max_wait``."""
        budget = self._budgets.get(api, now := self._clock.monotonic())
        ahead = self._creating.get(api, 0)
        if (ahead + 1) / budget.rate > max_wait:
            raise BudgetBusy(api, max(1, math.ceil((ahead + 1) / budget.rate)))
        self._creating[api] = ahead + 1
        try:
            yield now + max_wait
        finally:
            self._creating[api] -= 1

    @asynccontextmanager
    async def admit(self, api: str, *, max_wait: float | None = None) -> AsyncIterator[None]:
        """Make one call within ``api``'s budget; waits for it (``max_wait``: at most that, then
        ``BudgetBusy``)."""
        budget = self._budgets.get(api, self._clock.monotonic())
        deadline = math.inf if max_wait is None else self._clock.monotonic() + max_wait
        await self._take(api, budget, deadline, max_wait)
        try:
            grant = await self._through_gate(api, budget, deadline)
        except BaseException:
            budget.settle(self._clock.monotonic())
            raise
        try:
            yield
        finally:
            budget.settle(self._clock.monotonic())
            if self._gate is not None and grant is not None:
                self._gate.leave(grant)

    async def _take(self, api: str, budget: AppBudget, deadline: float, max_wait: float | None) -> None:
        self._queued[api] = self._queued.get(api, 0) + 1
        try:
            if max_wait is not None and self._queued[api] / budget.rate > max_wait:
                raise self._busy(api, budget)
            while not budget.try_take(now := self._clock.monotonic(), urgent=True):
                if now >= deadline:
                    raise self._busy(api, budget)
                wait = min(max(budget.next_available(now, urgent=True) - now, _MIN_SLEEP), _POLL)
                await self._clock.sleep(min(wait, max(deadline - now, _MIN_SLEEP)))
        finally:
            self._queued[api] -= 1

    async def _through_gate(self, api: str, budget: AppBudget, deadline: float) -> object | None:
        # Without the lease (cluster mode) the gate refuses: the call goes ahead on the local budget alone.
        if self._gate is None:
            return None
        remaining = deadline - self._clock.monotonic()
        try:
            async with asyncio.timeout(None if math.isinf(remaining) else max(remaining, _MIN_SLEEP)):
                return await self._gate.enter(api, urgent=True)
        except TimeoutError:
            raise self._busy(api, budget) from None

    def _busy(self, api: str, budget: AppBudget) -> BudgetBusy:
        """Past the bound: try again when the callers queued now have had their turn."""
        retry_after = max(1, math.ceil((self._queued.get(api, 0) + 1) / budget.rate))
        return BudgetBusy(api, retry_after)


__all__ = ["Admission", "BudgetBusy"]
