"""backoff.backoff_delay: the one formula the Open API retries and the scheduler share."""

from __future__ import annotations

import random

from feishu_progress.backoff import BackoffPolicy, backoff_delay
from feishu_progress.feishu.retry import FeishuRetryPolicy


def test_doubles_from_the_base_up_to_the_cap_with_jitter_in_the_upper_half() -> None:
    rng = random.Random(7)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (20, 4.0)]:
        delays = [backoff_delay(attempt, 0.5, 4.0, rng) for _ in range(200)]
        assert all(ceiling * 0.5 <= delay <= ceiling for delay in delays)
        assert max(delays) - min(delays) > ceiling * 0.3  # jittered, not a constant


def test_both_policies_wait_what_the_formula_says() -> None:
    send, card = FeishuRetryPolicy(), BackoffPolicy()
    for attempt in range(1, 10):
        expected = backoff_delay(attempt, send.base_seconds, send.max_seconds, random.Random(attempt))
        assert send.backoff(attempt, random.Random(attempt)) == expected
        expected = backoff_delay(attempt, card.base_seconds, card.max_seconds, random.Random(attempt))
        assert card.delay(attempt, random.Random(attempt)) == expected
