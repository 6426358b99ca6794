"""The shared budget's numbers: the Open APIs with a budget, and the GCRA windows derived from FP_RATE__*.

Pure: no I/O, no clock. ``budget.py`` hands these numbers to the Redis script.

Why the derived rates sit below Feishu's limits: Feishu counts a request when it ARRIVES, and our grant
happens a little earlier, by a delay that varies (event loop, connection pool, network) by up to
``arrival_jitter`` seconds. Arrivals inside any window of ``W`` seconds were therefore granted inside a
window of ``W + arrival_jitter`` seconds. A GCRA with emission interval ``T`` and burst ``b`` grants
``n`` requests only ``(n - b) * T`` apart at least, so any window of length ``L`` holds fewer than
``L / T + b`` grants. Choosing ``(W + jitter) / T + b = limit + 1`` keeps every window of arrivals within
the limit (``SharedBudgetTuning.windows``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from feishu_progress.config import RateSettings


class OpenApi(StrEnum):
    """The Open APIs whose app budgets are separate at Feishu (each 50/s and 1000/min by default): the
    names of ``config.ApiLimits``' fields, whose budgets (``RateSettings.for_api``) the windows follow."""

    PATCH = "patch"  # im/v1 message PATCH
    SEND = "send"  # im/v1 message create
    REPLY = "reply"  # im/v1 message reply
    IMAGE = "image"  # im/v1 image upload
    CARD_CREATE = "card_create"  # cardkit/v1 card create
    CARD_UPDATE = "card_update"  # cardkit/v1 card full update
    CARD_SETTINGS = "card_settings"  # cardkit/v1 card settings (streaming on/off)
    CARD_CONTENT = "card_content"  # cardkit/v1 element content (streamed text)
    TOKEN = "token"  # auth/v3 tenant_access_token


# A CardKit write takes the grants of all its calls first, then makes them one after another (settings,
# card, text), each after the previous answer: these calls reach Feishu a few round trips after their grant.
LATE_CALL_APIS = frozenset({OpenApi.CARD_UPDATE, OpenApi.CARD_SETTINGS, OpenApi.CARD_CONTENT})


@dataclass(frozen=True, slots=True)
class GcraWindow:
    """One GCRA window: a request every ``interval_us`` microseconds, ``burst`` of them back to back.

    ``ordinary_burst`` is the part of the burst an ordinary (not urgent) request may use; the rest is
    kept for urgent ones (final states, user clicks), so a flood of streaming updates never makes a
    final wait for the next interval.
    """

    interval_us: int  # whole microseconds, as the Redis script counts (rounded up: never faster)
    burst: int
    ordinary_burst: int

    @property
    def rate(self) -> float:
        """Sustained grants per second."""
        return 1_000_000 / self.interval_us

    def most_grants_within(self, seconds: float) -> int:
        """The most grants any half-open window of ``seconds`` can hold: fewer than seconds / T + burst."""
        span_us = round(seconds * 1_000_000)
        return (span_us + self.burst * self.interval_us - 1) // self.interval_us


@dataclass(frozen=True, slots=True)
class BudgetWindows:
    """The two windows every shared budget enforces together (Feishu trips on either)."""

    short: GcraWindow  # Feishu's per-second limit
    long: GcraWindow  # Feishu's per-minute limit


@dataclass(frozen=True, slots=True)
class SharedBudgetTuning:
    """Headroom of the shared budget; the defaults give 43.8/s burst 5 and 950/min burst 50 for 50/1000.

    ``short_window`` / ``long_window`` are Feishu's 1 s and 60 s; tests shrink them to see both
    windows bind within seconds.
    """

    arrival_jitter: float = 0.05  # seconds between our grant and Feishu counting the request, at most
    # The same for LATE_CALL_APIS: 50 ms let two 429s through in about one run of three of the
    # three-instance cluster test (card_content, card_update); 250 ms covers a write's three calls.
    late_call_jitter: float = 0.25
    short_burst_share: float = 0.1  # burst of the per-second window, as a share of its limit
    long_burst_share: float = 0.05  # burst of the per-minute window, as a share of its limit
    urgent_reserve_share: float = 0.2  # share of each burst only urgent requests may use (at least 1)
    short_window: float = 1.0
    long_window: float = 60.0

    def windows(self, rate: RateSettings, *, late_calls: bool = False) -> BudgetWindows:
        """The GCRA windows for ``rate``'s app_per_second / app_per_minute (one API's: ``for_api``);
        ``late_calls``: the API's requests may arrive ``late_call_jitter`` after their grant."""
        jitter = self.late_call_jitter if late_calls else self.arrival_jitter
        return BudgetWindows(
            short=self._window(rate.app_per_second, self.short_window, self.short_burst_share, jitter),
            long=self._window(rate.app_per_minute, self.long_window, self.long_burst_share, jitter),
        )

    def _window(self, limit: float, window: float, burst_share: float, jitter: float) -> GcraWindow:
        whole_limit = max(1, math.floor(limit))
        burst = min(whole_limit, max(1, round(whole_limit * burst_share)))
        # Any window of arrivals holds < (window + jitter) / interval + burst grants: make that limit + 1.
        interval_us = math.ceil((window + jitter) * 1_000_000 / (whole_limit + 1 - burst))
        reserve = 0 if burst == 1 else min(burst - 1, max(1, round(burst * self.urgent_reserve_share)))
        return GcraWindow(interval_us=interval_us, burst=burst, ordinary_burst=burst - reserve)

    def local_share(self, rate: RateSettings, live_instances: int) -> RateSettings:
        """This instance's part of the budget while Redis is out of reach: the budget ÷ live instances."""
        share = max(1, live_instances)
        return rate.model_copy(
            update={
                "app_per_second": rate.app_per_second / share,
                "app_per_minute": rate.app_per_minute / share,
            }
        )
