"""The app budgets: each Open API's own (Feishu's 50/s and 1000/min per app by default, capped by
FP_RATE__APP_PER_*), never exceeded, spent smoothly. ``BudgetTable`` holds one ``AppBudget`` per API.

Two exact sliding windows are the hard guarantee (no 1 s window ever holds more than ``app_per_second``
starts, no 60 s window more than ``app_per_minute``). A plain token bucket alone would not give that (a
full bucket plus its refill lets up to twice the limit through one window). A third piece, a token bucket
refilled at the per-minute rate with a per-second-sized burst, spreads the minute's budget evenly, so the
minute is not spent in its first 20 seconds and then leaves every card waiting 40.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from feishu_progress.config import RateSettings

# The hard caps compare exactly (never early by a rounding error); the smoothing bucket may round up a
# token a microsecond early, which cannot break the caps.
_TOKEN_SLACK = 1e-6


class SlidingWindow:
    """At most ``limit`` requests in any window of ``window`` seconds, as the gateway counts them.

    The gateway counts a request when it ARRIVES, somewhere between our start and the answer. So a slot
    is held from the start (``record``) and only freed one window after the request ENDED (``settle``):
    counting from the start would free it early by the request's latency, and a faster next request
    could then land inside the gateway's window (measured against the sandbox: 429s at the window edges).
    """

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._ends: list[float] = []  # sorted end times of settled requests still inside a window
        self._in_flight = 0

    def _prune(self, now: float) -> None:
        del self._ends[: bisect.bisect_right(self._ends, now - self.window)]

    def next_free(self, now: float) -> float:
        """The earliest time a request fits (``now`` when it fits already, ``inf`` until a flight ends)."""
        self._prune(now)
        excess = len(self._ends) + self._in_flight - self.limit
        if excess < 0:
            return now
        if excess >= len(self._ends):
            return math.inf  # every slot is held by a request still in flight
        return self._ends[excess] + self.window

    def record(self, now: float) -> None:
        """Hold one slot for a request starting at ``now``."""
        self._in_flight += 1

    def used(self, now: float) -> int:
        """Slots held at ``now``: requests in flight and those that ended within the window."""
        self._prune(now)
        return len(self._ends) + self._in_flight

    def settle(self, end: float) -> None:
        """The request holding a slot ended at ``end``: its slot frees one window later."""
        if self._in_flight > 0:
            self._in_flight -= 1
            bisect.insort(self._ends, end)

    def release(self) -> None:
        """The slot's request was never sent: nothing reached the gateway, so the slot frees now."""
        if self._in_flight > 0:
            self._in_flight -= 1


class TokenBucket:
    """Tokens refill at ``rate`` per second up to ``capacity``; one event takes one token."""

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        self.capacity = capacity
        self.rate = rate
        self._tokens = capacity
        self._updated = now

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self._tokens = min(self.capacity, self._tokens + (now - self._updated) * self.rate)
            self._updated = now

    def next_free(self, now: float) -> float:
        """The earliest time a whole token is available."""
        self._refill(now)
        missing = 1.0 - self._tokens
        return now if missing <= _TOKEN_SLACK else now + missing / self.rate

    def record(self, now: float) -> None:
        """Take one token (the caller checked ``next_free`` first)."""
        self._refill(now)
        self._tokens -= 1.0

    def give_back(self, now: float) -> None:
        """Return a token whose event never happened."""
        self._refill(now)
        self._tokens = min(self.capacity, self._tokens + 1.0)

    def resize(self, capacity: float, rate: float, now: float) -> None:
        """New capacity and rate from ``now`` on; the tokens already spent stay spent (a full bucket
        stays full)."""
        self._refill(now)
        self._tokens = min(self._tokens + max(0.0, capacity - self.capacity), capacity)
        self.capacity, self.rate = capacity, rate


class AppBudget:
    """The budget shared by every card of the app; ``pause_until`` stops it all after a gateway limit."""

    def __init__(self, rate: RateSettings, now: float) -> None:
        per_second, per_minute = _whole_limits(rate)
        self._second = SlidingWindow(per_second, 1.0)
        self._minute = SlidingWindow(per_minute, 60.0)
        self._spread = TokenBucket(capacity=per_second, rate=per_minute / 60.0, now=now)
        self._paused_until = -math.inf
        self.rate = min(float(per_second), per_minute / 60.0)  # calls per second it sustains

    def resize(self, rate: RateSettings, now: float) -> None:
        """Spend at ``rate``'s limits from ``now`` on, still counting every call already counted.

        For a budget whose limits change while calls are counted in it (the cluster's local share,
        when the number of live instances changes): a new budget would start empty and let a second
        window's worth through on top of the calls the gateway still counts.
        """
        per_second, per_minute = _whole_limits(rate)
        self._second.limit, self._minute.limit = per_second, per_minute
        self._spread.resize(capacity=per_second, rate=per_minute / 60.0, now=now)
        self.rate = min(float(per_second), per_minute / 60.0)

    @property
    def paused_until(self) -> float:
        """Monotonic time until which no PATCH may start (``-inf`` when not paused)."""
        return self._paused_until

    def next_available(self, now: float, *, urgent: bool = False, behind_gate: bool = False) -> float:
        """The earliest time one more PATCH may start.

        An urgent one (a final state, a click) is held only by the hard windows, not by the smoothing
        bucket: it borrows from the bucket (which may go below zero), and ordinary updates repay it.
        That is what lets 100 finals go out within two seconds after an outage.

        ``behind_gate`` (cluster mode): every call then passes the shared budget at the gate, which holds
        the whole app to Feishu's limits, so an urgent one is held only by a pause here. The local
        windows count flights from their start, and ordinary flights queued at the gate fill them: a
        card taken over waited for one of those to finish, at this instance's share of the shared rate.
        """
        if urgent and behind_gate:
            return max(now, self._paused_until)
        hard = max(self._paused_until, self._second.next_free(now), self._minute.next_free(now))
        return hard if urgent else max(hard, self._spread.next_free(now))

    def try_take(self, now: float, *, urgent: bool = False, behind_gate: bool = False) -> bool:
        """Count one PATCH start at ``now`` if the budget allows it."""
        if self.next_available(now, urgent=urgent, behind_gate=behind_gate) > now:
            return False
        self._second.record(now)
        self._minute.record(now)
        self._spread.record(now)
        return True

    def settle(self, end: float) -> None:
        """One request counted by ``try_take`` ended at ``end`` (answered, failed or cancelled)."""
        self._second.settle(end)
        self._minute.settle(end)

    def release(self, now: float) -> None:
        """One request counted by ``try_take`` was never sent (its write did not need the call, or the
        gate let nothing out): its slots free at once instead of holding a window for nothing."""
        self._second.release()
        self._minute.release()
        self._spread.give_back(now)

    def minute_use(self, now: float) -> float:
        """The share of the per-minute limit held at ``now`` (0..1; what ``/metrics`` reports)."""
        return self._minute.used(now) / self._minute.limit

    def pause_until(self, until: float) -> None:
        """Stop spending until ``until`` (never shortens a longer pause)."""
        self._paused_until = max(self._paused_until, until)


def _whole_limits(rate: RateSettings) -> tuple[int, int]:
    """The per-second and per-minute limits as whole calls (at least one each)."""
    return max(1, math.floor(rate.app_per_second)), max(1, math.floor(rate.app_per_minute))


class BudgetTable:
    """One ``AppBudget`` per Open API (``RateSettings.for_api``), made on first use: the one table every
    call of this process is charged to, card writes and the calls that are not (sends, creates)."""

    def __init__(self, rate: RateSettings) -> None:
        self._rate = rate
        self._budgets: dict[str, AppBudget] = {}

    def get(self, api: str, now: float) -> AppBudget:
        """``api``'s budget (KeyError for an API the table does not know)."""
        budget = self._budgets.get(api)
        if budget is None:
            budget = self._budgets[api] = AppBudget(self._rate.for_api(api), now)
        return budget

    def soonest(self, apis: Iterable[str], now: float) -> float:
        """The soonest any of ``apis`` has room (``now`` for none: nothing to wait for)."""
        return min((self.get(api, now).next_available(now, urgent=True) for api in apis), default=now)

    def take_first(
        self,
        choices: tuple[tuple[str, ...], ...],
        now: float,
        spent: dict[str, float],
        *,
        urgent: bool,
        behind_gate: bool = False,
    ) -> tuple[str, ...] | None:
        """The first choice whose budgets all have room, one slot of each taken (all or none); None when
        none has: ``spent`` then learns which were full and when each frees (``behind_gate``: see
        ``AppBudget.next_available``)."""
        for apis in choices:
            if not (urgent and behind_gate) and any(api in spent for api in apis):
                continue
            blocked = {
                api: at
                for api in apis
                if (at := self.get(api, now).next_available(now, urgent=urgent, behind_gate=behind_gate))
                > now
            }
            if not blocked:
                for api in apis:
                    self.get(api, now).try_take(now, urgent=urgent, behind_gate=behind_gate)
                return apis
            spent.update(blocked)
        return None
