"""The one backoff formula: exponential from a base, capped, with jitter (pure: no clock, no I/O).

Used by every retry that has no server-named wait: the Open API creates (``feishu/retry.py``) and the
scheduler's card writes (``progress/scheduler.py``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# The wait is drawn from [half, all] of its ceiling: enough spread that cards (or instances) failing
# together do not retry together, while the wait never drops below half of what the attempt earned.
JITTER_FLOOR = 0.5


def backoff_delay(attempt: int, base_seconds: float, max_seconds: float, rng: random.Random) -> float:
    """Seconds to wait after failed attempt ``attempt`` (from 1): ``base · 2^(attempt-1)``, at most
    ``max_seconds``, times a random factor in [0.5, 1]."""
    ceiling: float = min(max_seconds, base_seconds * 2.0 ** (attempt - 1))
    return ceiling * rng.uniform(JITTER_FLOOR, 1.0)


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """The scheduler's card writes: bounded exponential backoff with jitter; terminal states get more
    (still bounded) patience."""

    base_seconds: float = 0.5
    max_seconds: float = 30.0
    max_attempts: int = 8

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (attempt counts from 1)."""
        return backoff_delay(attempt, self.base_seconds, self.max_seconds, rng)

    def attempts_for(self, terminal: bool) -> float:
        """How many failed attempts a state gets: a final state never gives up while the process lives."""
        return math.inf if terminal else self.max_attempts
