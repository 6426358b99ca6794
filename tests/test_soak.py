"""The soak (bench/soak.py): its arithmetic, and CI's minute of it at 100 live cards through the same code.

The minute is a short soak: 100 slots, each a task streaming workload.py's default stream for 10–25 s,
then finished and replaced, the service and the sandbox as processes of their own (``run_soak`` stops
both however the run ends). What can fail: a leak of fds, a stalled event loop, a rate-limit answer, a
final that never reached the card.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import soak

INF = math.inf
FD_GROWTH_BOUND = 16  # connections opened and closed between two samples, not a leak


def test_bucket_quantile_interpolates_within_its_bucket_as_prometheus_does() -> None:
    buckets = {0.01: 50.0, 0.05: 90.0, 0.1: 100.0, INF: 100.0}
    assert soak.bucket_quantile(0.5, buckets) == pytest.approx(0.01)
    assert soak.bucket_quantile(0.7, buckets) == pytest.approx(0.03)  # 20 of the bucket's 40, halfway
    assert soak.bucket_quantile(0.99, buckets) == pytest.approx(0.095)
    assert soak.bucket_quantile(0.99, {0.1: 0.0, 1.0: 0.0, INF: 10.0}) == 1.0  # +Inf: the highest bound
    assert math.isnan(soak.bucket_quantile(0.99, {0.1: 0.0, INF: 0.0}))


def test_an_interval_counts_only_what_its_buckets_gained() -> None:
    before = soak.parse_exposition(exposition(lag_counts=(10, 10, 10), events=100))
    now = soak.parse_exposition(exposition(lag_counts=(10, 10, 20), events=400))
    grown = soak.bucket_increase(now.buckets[soak.LAG], before.buckets[soak.LAG])
    assert grown == {0.001: 0.0, 0.05: 0.0, INF: 10.0}  # ten samples, all above 50 ms
    assert soak.bucket_quantile(0.99, grown) == 0.05
    assert now.totals["fp_events_total"] - before.totals["fp_events_total"] == 300


def test_rss_flatness_and_slope_are_taken_after_warm_up() -> None:
    result = soak.SoakResult(soak.SoakConfig(sample_seconds=60, warmup=180))
    rss = [50, 90, 100, 102, 101, 103]  # MiB: the ramp, then flat
    result.samples = [sample(t=60 * (i + 1), rss=mib * soak.MIB, fds=40 + i) for i, mib in enumerate(rss)]
    assert [s.t for s in result.steady] == [180, 240, 300, 360]
    assert result.rss_spread_pct == pytest.approx(3.0)  # (103 - 100) / 100
    assert result.rss_slope_pct_per_hour == pytest.approx(0.8 * 60)  # 0.8 MiB a minute, of 100
    assert result.fd_growth == 3


def test_fd_growth_leaves_out_the_connections_clients_opened_to_the_service() -> None:
    result = soak.SoakResult(soak.SoakConfig(sample_seconds=60, warmup=60))
    # 20 more keep-alive connections from busier clients, and 2 fds the service itself opened.
    result.samples = [
        sample(t=60, rss=1, fds=100, client_fds=30),
        sample(t=120, rss=1, fds=122, client_fds=50),
    ]
    assert result.fd_growth == 2


def test_accepted_connections_are_counted_by_the_port_they_came_in_on() -> None:
    """Through this process's own /proc: the accepted ends count, the listener and the client ends
    (which have ports of their own) do not."""
    with contextlib.ExitStack() as stack:
        listener, other = (stack.enter_context(socket.create_server(("127.0.0.1", 0))) for _ in range(2))
        port, other_port = listener.getsockname()[1], other.getsockname()[1]
        clients = [stack.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(3)]
        accepted = [stack.enter_context(listener.accept()[0]) for _ in clients]
        stack.enter_context(socket.create_connection(("127.0.0.1", other_port)))
        stack.enter_context(other.accept()[0])
        assert soak.accepted_connections(os.getpid(), frozenset({port})) == 3
        assert soak.accepted_connections(os.getpid(), frozenset({port, other_port})) == 4
        accepted.pop().close()
        assert soak.accepted_connections(os.getpid(), frozenset({port})) == 2


@pytest.mark.slow
async def test_a_minute_at_100_live_cards_leaks_no_fd_keeps_the_loop_quick_and_delivers_every_final() -> None:
    # Warm-up past the first tasks' ends (10–25 s): their finals come together, and the connections the
    # runtime opens for that wave stay open; after it the fd count holds still.
    config = soak.SoakConfig(cards=100, seconds=60, sample_seconds=10, lifetime=(10, 25), warmup=30)
    result = await soak.run_soak(config)
    print(soak.report(result))  # shown when the test fails
    assert len(result.samples) == 6
    assert all(s.rss > 0 and s.fds > 0 for s in result.samples)
    assert all(s.lag_p99 < 0.5 for s in result.samples), [s.lag_p99 for s in result.samples]  # NaN fails too
    assert result.fd_growth <= FD_GROWTH_BOUND
    assert sum(s.rate_limited for s in result.samples) == 0
    assert result.finished > config.cards  # cards finished and new ones started
    assert result.post_errors == 0 and result.create_failures == 0
    assert result.delivered == result.finished


def exposition(*, lag_counts: tuple[int, int, int], events: int) -> str:
    small, mid, total = lag_counts
    return (
        "# TYPE fp_event_loop_lag_seconds histogram\n"
        f'fp_event_loop_lag_seconds_bucket{{le="0.001"}} {small}\n'
        f'fp_event_loop_lag_seconds_bucket{{le="0.05"}} {mid}\n'
        f'fp_event_loop_lag_seconds_bucket{{le="+Inf"}} {total}\n'
        f"fp_event_loop_lag_seconds_count {total}\n"
        "fp_event_loop_lag_seconds_sum 1.0\n"
        "# TYPE fp_events_total counter\n"
        f"fp_events_total {events}\n"
    )


def sample(*, t: float, rss: int, fds: int, client_fds: int = 0) -> soak.Sample:
    return soak.Sample(
        t=t,
        live_cards=100,
        rss=rss,
        fds=fds,
        client_fds=client_fds,
        cpu_cores=0.5,
        cpu_wait=0.0,
        lag_p99=0.01,
        stale_p99=1.0,
        events_per_s=1000.0,
        rate_limited=0,
        finished=0,
        delivered=0,
        sandbox_rss=rss,
    )
