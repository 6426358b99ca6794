"""Benchmark: a soak — N live cards for an hour; the service's RSS, fds, loop lag and staleness over time.

    python bench/soak.py                       # 1,000 live cards for 60 min, a sample every minute
    python bench/soak.py --cards 100 --seconds 60 --sample-seconds 10 --lifetime-seconds 10,25 --no-write

The second line is the CI version: tests/test_soak.py runs it through ``run_soak``.

There are three processes, as in load.py and freshness.py. The SANDBOX enforces Feishu's limits on every
API and lifts none. The SERVICE is freshness.py's: ``create_app`` on SQLite in a temp dir, with the
default transport (CardKit) and the garbage-collector settings ``serve`` uses. This process plays the
RUNTIME CLIENTS.

LOAD. ``--cards`` slots each hold one live task at a time. The task is created through the runtime API
and streams workload.py's default stream: one step every 20–50 ms, one POST every 250 ms carrying the
steps due, one POST in flight. It lives a random 2–10 minutes (``--lifetime-seconds 120,600``), then
finishes (its final batch) and is replaced at once by a new task in the same slot. So N tasks stay live,
cards keep finishing and new ones keep starting: at 1,000 cards about 2.8 a second, 10,000 an hour.
The CardKit streaming window closes after 10 minutes; tasks older than 9 minutes (about one in eight)
make the service re-open it.

REAL TIME, no scaled clock. The default stream offers about 28.6 events/s per card, so 28,600/s at
1,000 cards. At 200 cards (one 90 s run) the service used 0.45–0.7 of a core for 5,600 events/s,
about 0.09 CPU s per 1,000 events at ~7 events per POST. At that cost 1,000 cards would need 2.5 cores
of a loop that runs on one. So at 1,000 cards the loop is saturated, and it keeps up only because
batches grow as POSTs wait: load.py measured 0.064 CPU s per 1,000 events at 57 events per POST and
0.015 at 160. The 1,000-card lag is therefore a saturated loop's lag. Whether it absorbs the whole
stream shows as events/s accepted per card (≈ 28.6 when it does) and CPU near 1.00. Run it on an
otherwise idle machine: "waiting for a CPU" is the share of each interval the loop's thread was runnable
but not running, and that adds to the lag.

SAMPLES, every ``--sample-seconds``, all read from outside the service:

- from /proc: the service's RSS (VmRSS), its open fds (entries of /proc/<pid>/fd) and how many of them
  are connections the clients opened to it (their keep-alive connections: as many as they lately had
  requests in flight together, so a busy machine raises them; the fd growth is of the others, the fds
  the service itself holds), its CPU use (utime + stime over the interval) and its main thread's wait for
  a CPU (schedstat's run delay);
- from its admin ``/metrics``: event-loop lag p99 and delivery staleness p99 over the interval, computed
  from the increase of the buckets of ``fp_event_loop_lag_seconds`` and ``fp_delivery_staleness_seconds``,
  interpolated within a bucket as Prometheus's ``histogram_quantile`` does; events/s accepted
  (``fp_events_total``); live cards (``fp_live_cards``);
- from the sandbox: rate-limit answers (230020, 99991400) and the finals shown so far.

SUMMARY. Warm-up is ``--warmup-seconds``, by default the longest lifetime: by then every first task has
been replaced, so the ages of the live tasks are as mixed as they will stay. Over the samples after
warm-up the summary gives:

- RSS slope: least squares, in % per hour of the first RSS after warm-up;
- RSS spread: (max − min) ÷ first. Flat means ≤ 5 %;
- fd growth: last − first;
- the highest lag p99 (target < 50 ms) and the highest staleness p99;
- finals delivered: the share of all finished tasks whose final the sandbox showed. The last ones are
  finished when the run ends and waited for.

The sandbox keeps only the latest card of each message; otherwise it would hold every card shown in an
hour. It records the chats whose card turned COMPLETED's green. Each task has a chat of its own
(freshness.Runtime creates in ``oc_fresh_<index>``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import multiprocessing
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import freshness
from bench.common import ScaledClock, median, rss_bytes, write_section
from bench.workload import TaskStream

LAG = "fp_event_loop_lag_seconds"
STALENESS = "fp_delivery_staleness_seconds"
CREATE_CONCURRENCY = 64  # as freshness.py and load.py: the first N creates in parallel, within the budgets
CREATE_RETRY_SECONDS = 1.0
BUDGET_PER_SECOND = 1000 / 60  # each card-write API: 1000 per minute per app
RSS_FLAT_PCT = 5.0
LAG_P99_TARGET = 0.050
MIB = 1024 * 1024


@dataclass(frozen=True)
class SoakConfig:
    cards: int = 1000
    seconds: float = 3600.0
    sample_seconds: float = 60.0
    lifetime: tuple[float, float] = (120.0, 600.0)  # a task lives uniform(low, high) s
    warmup: float | None = None  # None: the longest lifetime
    flush: float = 0.25  # a runtime client's batching interval, as load.py's default
    transport: str = "cardkit"
    seed: int = 0

    @property
    def warmup_seconds(self) -> float:
        return self.lifetime[1] if self.warmup is None else self.warmup


# --- reading a /metrics page --------------------------------------------------------------------


@dataclass(frozen=True)
class Exposition:
    """One scrape of /metrics: each sample name's sum over its series, and each histogram's buckets."""

    totals: dict[str, float]
    buckets: dict[str, dict[float, float]]  # histogram name -> upper bound -> cumulative count


def parse_exposition(text: str) -> Exposition:
    totals: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bounds = buckets.setdefault(family.name, {})
                bound = float(sample.labels["le"])
                bounds[bound] = bounds.get(bound, 0.0) + sample.value
            else:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return Exposition(totals, buckets)


def bucket_increase(now: Mapping[float, float], before: Mapping[float, float]) -> dict[float, float]:
    return {bound: count - before.get(bound, 0.0) for bound, count in now.items()}


def bucket_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """The q-quantile (0 < q ≤ 1) of cumulative bucket counts {upper bound: count}, as Prometheus's
    ``histogram_quantile``: linear within its bucket; in the +Inf bucket, the highest finite bound."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank and count > below:
            return lower if math.isinf(bound) else lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


# --- the processes ------------------------------------------------------------------------------


def _serve_sandbox(queue: Any) -> None:
    from feishu_progress.cards.builder import HEADER_TEMPLATES
    from feishu_progress.domain import TaskStatus
    from feishu_progress.sandbox.server import STATE_KEY, create_sandbox_app
    from feishu_progress.sandbox.state import SandboxConfig, SandboxMessage
    from feishu_progress.web.http import serving

    final_template = HEADER_TEMPLATES[TaskStatus.COMPLETED]
    finals: set[str] = set()  # chats whose card shows its final state

    def witness(message: SandboxMessage) -> None:
        del message.history[:-1]  # only the latest card: an hour of every card shown would be gigabytes
        if message.card.get("header", {}).get("template") == final_template:
            finals.add(message.chat_id)

    async def report(request: web.Request) -> web.Response:
        state = request.app[STATE_KEY]
        return web.json_response({"finals": sorted(finals), "rate_limited": state.rate_limited()})

    async def serve() -> None:
        config = SandboxConfig(app_id=freshness.APP_ID, app_secret=freshness.APP_SECRET)
        app = create_sandbox_app(config)
        app[STATE_KEY].listeners.append(witness)
        app.router.add_get("/_bench/soak", report)
        async with serving(app) as base_url:
            queue.put(base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def accepted_connections(pid: int, ports: frozenset[int]) -> int:
    """The open fds of ``pid`` that are TCP connections it accepted on one of ``ports``.

    Those are the clients' keep-alive connections: how many there are follows how many requests the
    clients had in flight together lately (up to their pools' sizes), not what the service holds on to.
    """
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()  # sl, local address, remote address, state, ..., inode (the 10th)
            if int(fields[1].rsplit(":", 1)[1], 16) in ports and fields[3] != _TCP_LISTEN:
                inodes.add(fields[9])
    accepted = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing
            if os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]") in inodes:
                accepted += 1
    return accepted


_TCP_LISTEN = "0A"  # /proc/net/tcp's state of a listening socket


def _port(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


def cpu_wait_seconds(pid: int) -> float:
    """How long the main thread of ``pid`` (the event loop's) has waited, runnable, for a CPU so far
    (/proc/<pid>/schedstat's run delay): lag that the machine caused, not the service."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- samples ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """Everything read at one moment: the service's process and /metrics, and the sandbox's report."""

    at: float  # time.monotonic()
    rss: int
    fds: int
    client_fds: int  # of ``fds``: connections the clients opened to the service
    cpu: float
    cpu_wait: float
    metrics: Exposition
    finals: frozenset[str]
    rate_limited: int
    sandbox_rss: int


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the start
    live_cards: int
    rss: int
    fds: int
    client_fds: int  # of ``fds``: connections the clients opened to the service (not its own)
    cpu_cores: float
    cpu_wait: float  # share of the interval the event loop's thread waited for a CPU
    lag_p99: float
    stale_p99: float
    events_per_s: float
    rate_limited: int  # in this interval
    finished: int  # tasks finished so far (their final batch answered 202)
    delivered: int  # of those, finals the sandbox showed
    sandbox_rss: int

    @property
    def own_fds(self) -> int:
        """The fds the service holds itself: files, pipes, listening sockets, its own connections."""
        return self.fds - self.client_fds


def interval_quantile(name: str, now: Reading, before: Reading, q: float = 0.99) -> float:
    grown = bucket_increase(now.metrics.buckets.get(name, {}), before.metrics.buckets.get(name, {}))
    return bucket_quantile(q, grown)


def sample_between(before: Reading, now: Reading, started: float, finished: set[str]) -> Sample:
    seconds = now.at - before.at
    events = now.metrics.totals.get("fp_events_total", 0.0) - before.metrics.totals.get(
        "fp_events_total", 0.0
    )
    return Sample(
        t=now.at - started,
        live_cards=int(now.metrics.totals.get("fp_live_cards", 0)),
        rss=now.rss,
        fds=now.fds,
        client_fds=now.client_fds,
        cpu_cores=(now.cpu - before.cpu) / seconds,
        cpu_wait=(now.cpu_wait - before.cpu_wait) / seconds,
        lag_p99=interval_quantile(LAG, now, before),
        stale_p99=interval_quantile(STALENESS, now, before),
        events_per_s=events / seconds,
        rate_limited=now.rate_limited - before.rate_limited,
        finished=len(finished),
        delivered=len(finished & now.finals),
        sandbox_rss=now.sandbox_rss,
    )


class Probe:
    """Reads the service (its process and its admin /metrics) and the sandbox's report."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        urls: tuple[str, str, str],
        pid: int,
        sandbox_pid: int,
    ) -> None:
        """``urls``: the service's API, its admin, the sandbox."""
        service_url, admin_url, sandbox_url = urls
        self.served_ports = frozenset(_port(url) for url in (service_url, admin_url))
        self.http = http
        self.admin_url = admin_url
        self.sandbox_url = sandbox_url
        self.pid = pid
        self.sandbox_pid = sandbox_pid

    async def read(self) -> Reading:
        async with self.http.get(f"{self.admin_url}/metrics") as response:
            metrics = parse_exposition(await response.text())
        report = await self.report()
        return Reading(
            at=time.monotonic(),
            rss=rss_bytes(self.pid),
            fds=open_fds(self.pid),
            client_fds=accepted_connections(self.pid, self.served_ports),
            cpu=cpu_seconds(self.pid),
            cpu_wait=cpu_wait_seconds(self.pid),
            metrics=metrics,
            finals=frozenset(report["finals"]),
            rate_limited=int(report["rate_limited"]),
            sandbox_rss=rss_bytes(self.sandbox_pid),
        )

    async def report(self) -> dict[str, Any]:
        async with self.http.get(f"{self.sandbox_url}/_bench/soak") as response:
            return dict(await response.json())


# --- the runtime clients ------------------------------------------------------------------------


def chat_of(index: int) -> str:
    return f"oc_fresh_{index}"  # the receive_id freshness.Runtime.create gives task ``index``


class Slots:
    """``config.cards`` slots, each streaming one task at a time and replacing it when it finishes."""

    def __init__(self, runtime: freshness.Runtime, config: SoakConfig) -> None:
        self.runtime = runtime
        self.config = config
        self.finished: set[str] = set()  # chats of the tasks whose final batch was answered 202
        self.created = 0
        self.create_failures = 0
        self._indices = itertools.count()
        self._create_gate = asyncio.Semaphore(CREATE_CONCURRENCY)
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        """Until ``stop``: then every slot finishes its task and returns."""
        await asyncio.gather(*(self._slot(slot) for slot in range(self.config.cards)))

    def stop(self) -> None:
        self._stopping.set()

    async def _slot(self, slot: int) -> None:
        rng = random.Random(f"{self.config.seed}:{slot}")
        while not self._stopping.is_set():
            index = next(self._indices)
            session_id = await self._create(index)
            if session_id is None:
                continue
            ends = time.monotonic() + rng.uniform(*self.config.lifetime)
            stream = TaskStream(index, time.monotonic(), rng)
            await self._stream(session_id, stream, ends, rng)
            if await self.runtime.post(session_id, *stream.final()):
                self.finished.add(chat_of(index))

    async def _create(self, index: int) -> int | None:
        """The new task's session id; None (after a pause) when the create failed even after its retries."""
        async with self._create_gate:
            try:
                session_id = await self.runtime.create(index)  # honours a 503's retry_after
            except (RuntimeError, aiohttp.ClientError, TimeoutError):
                self.create_failures += 1
                await asyncio.sleep(CREATE_RETRY_SECONDS)
                return None
        self.created += 1
        return session_id

    async def _stream(self, session_id: int, stream: TaskStream, ends: float, rng: random.Random) -> None:
        flush = self.config.flush
        while time.monotonic() < ends and not self._stopping.is_set():
            events = stream.due(time.monotonic())
            if events:
                await self.runtime.post(session_id, *events)
            await asyncio.sleep(min(flush * rng.uniform(0.8, 1.2), max(0.0, ends - time.monotonic())))


# --- one soak -----------------------------------------------------------------------------------


@dataclass
class SoakResult:
    config: SoakConfig
    samples: list[Sample] = field(default_factory=list)
    created: int = 0
    finished: int = 0
    delivered: int = 0  # after the drain
    create_failures: int = 0
    post_errors: int = 0

    @property
    def steady(self) -> list[Sample]:
        """The samples after warm-up."""
        return [s for s in self.samples if s.t >= self.config.warmup_seconds - 1e-6]

    @property
    def rss_slope_pct_per_hour(self) -> float:
        steady = self.steady
        if len(steady) < 2:
            return math.nan
        slope = statistics.linear_regression([s.t for s in steady], [float(s.rss) for s in steady]).slope
        return 100.0 * slope * 3600 / steady[0].rss

    @property
    def rss_spread_pct(self) -> float:
        rss = [s.rss for s in self.steady]
        return 100.0 * (max(rss) - min(rss)) / rss[0] if rss else math.nan

    @property
    def fd_growth(self) -> int:
        """How many more fds the service itself holds at the end than after warm-up (its clients'
        connections left out: they follow the clients' concurrency, and a leak is the service's)."""
        steady = self.steady
        return steady[-1].own_fds - steady[0].own_fds if steady else 0

    @property
    def finals_pct(self) -> float:
        return 100.0 * self.delivered / self.finished if self.finished else math.nan

    def worst(self, attribute: str) -> float:
        """The highest ``attribute`` over the samples after warm-up (NaN where an interval had none)."""
        values = [getattr(s, attribute) for s in self.steady if not math.isnan(getattr(s, attribute))]
        return max(values) if values else math.nan


async def run_soak(config: SoakConfig, *, progress: bool = False) -> SoakResult:
    """The sandbox and the service as processes, the slots here; both processes stop however it ends."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="fp-soak-") as workdir:
        try:
            procs.append(context.Process(target=_serve_sandbox, args=(queue,), daemon=True))
            procs[-1].start()
            sandbox_url = await asyncio.to_thread(queue.get, True, 60)
            admin_port = free_port()
            args = (queue, sandbox_url, 1.0, config.transport, workdir)
            service = context.Process(
                target=freshness._serve_service, args=args, kwargs={"admin_port": admin_port}, daemon=True
            )
            procs.append(service)
            service.start()
            service_url = await asyncio.to_thread(queue.get, True, 60)
            sandbox_pid, service_pid = (proc.pid for proc in procs)
            async with _client() as http:
                urls = (service_url, f"http://127.0.0.1:{admin_port}", sandbox_url)
                probe = Probe(http, urls, service_pid, sandbox_pid)
                runtime = freshness.Runtime(http, service_url, ScaledClock(1.0))
                return await _soak(config, probe, runtime, progress)
        finally:
            for proc in procs:
                _stop(proc)


def _client() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=256)
    headers = {"Authorization": f"Bearer {freshness.API_TOKEN}"}
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120), headers=headers
    )


def _stop(proc: Any) -> None:
    proc.terminate()
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join(10)


async def _soak(config: SoakConfig, probe: Probe, runtime: freshness.Runtime, progress: bool) -> SoakResult:
    result = SoakResult(config)
    slots = Slots(runtime, config)
    running = asyncio.create_task(slots.run())
    try:
        await _sample(probe, slots, result, progress=progress)
    finally:
        # After the last sample, so the burst of finals at the end falls in no interval.
        slots.stop()
        await running
    result.delivered = await _drain(probe, slots.finished, config.cards)
    result.created, result.finished = slots.created, len(slots.finished)
    result.create_failures, result.post_errors = slots.create_failures, runtime.errors
    return result


async def _sample(probe: Probe, slots: Slots, result: SoakResult, *, progress: bool) -> None:
    """A sample every ``sample_seconds`` for ``seconds``."""
    config = result.config
    before = await probe.read()
    started = before.at
    for k in range(1, int(config.seconds / config.sample_seconds + 1e-9) + 1):
        at = started + k * config.sample_seconds
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        now = await probe.read()
        result.samples.append(sample_between(before, now, started, slots.finished))
        if progress:
            print(row(result.samples[-1]), flush=True)
        before = now


async def _drain(probe: Probe, finished: set[str], cards: int) -> int:
    """Wait (bounded: two passes of the card-update budget) until every finished task shows its final;
    how many do."""
    deadline = time.monotonic() + max(30.0, 2 * cards / BUDGET_PER_SECOND + 10)
    while True:
        delivered = len(finished & set((await probe.report())["finals"]))
        if delivered == len(finished) or time.monotonic() > deadline:
            return delivered
        await asyncio.sleep(1.0)


# --- tables -------------------------------------------------------------------------------------

HEADER = (
    "| t (s) | live cards | RSS (MiB) | open fds (clients') | CPU (cores) | waiting for a CPU | lag p99 (ms) "
    "| staleness p99 (s) | events/s | rate-limit answers | finals shown / finished | sandbox RSS (MiB) |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _fmt(fmt: str, value: float) -> str:
    return "—" if math.isnan(value) else fmt.format(value)


def row(s: Sample) -> str:
    cells = (
        f"{s.t:.0f}",
        f"{s.live_cards:,}",
        f"{s.rss / MIB:.1f}",
        f"{s.fds} ({s.client_fds})",
        f"{s.cpu_cores:.2f}",
        f"{s.cpu_wait:.1%}",
        _fmt("{:.1f}", s.lag_p99 * 1000),
        _fmt("{:.2f}", s.stale_p99),
        f"{s.events_per_s:,.0f}",
        f"{s.rate_limited}",
        f"{s.delivered:,} / {s.finished:,}",
        f"{s.sandbox_rss / MIB:.0f}",
    )
    return "| " + " | ".join(cells) + " |"


def _per_card(events_per_s: float, r: SoakResult) -> str:
    return f"{events_per_s:,.0f} ({events_per_s / r.config.cards:.1f})"


def _verdict(ok: bool) -> str:
    return "✓" if ok else "✗"


def summary_rows(r: SoakResult) -> list[tuple[str, str, str]]:
    """(what, measured, target) after warm-up."""
    steady = r.steady
    if not steady:
        return [("samples after warm-up", "none: the run is shorter than its warm-up", "")]
    first, last = steady[0], steady[-1]
    rss = [s.rss / MIB for s in steady]
    fds = [s.own_fds for s in steady]
    lag = r.worst("lag_p99")
    return [
        (
            "RSS: first → last (min–max)",
            f"{rss[0]:.1f} → {rss[-1]:.1f} MiB ({min(rss):.1f}–{max(rss):.1f})",
            "",
        ),
        (
            "RSS spread (max − min) ÷ first",
            f"{r.rss_spread_pct:.1f} %",
            f"≤ 5 % {_verdict(r.rss_spread_pct <= RSS_FLAT_PCT)}",
        ),
        ("RSS slope (least squares)", f"{r.rss_slope_pct_per_hour:+.1f} % per hour", "flat"),
        (
            "the service's own open fds: first → last (min–max)",
            f"{first.own_fds} → {last.own_fds} ({min(fds)}–{max(fds)})",
            "",
        ),
        (
            "clients' connections to it: first → last",
            f"{first.client_fds} → {last.client_fds}",
            "",
        ),
        ("fd growth (last − first, its own)", f"{r.fd_growth:+d}", f"none {_verdict(r.fd_growth <= 0)}"),
        (
            "event-loop lag p99, worst interval",
            _fmt("{:.1f} ms", lag * 1000),
            f"< 50 ms {_verdict(lag < LAG_P99_TARGET)}",
        ),
        ("delivery staleness p99, worst interval", _fmt("{:.2f} s", r.worst("stale_p99")), ""),
        ("service CPU, median (cores)", f"{median(s.cpu_cores for s in steady):.2f}", ""),
        ("event loop's thread waiting for a CPU, worst interval", f"{r.worst('cpu_wait'):.1%}", "~0"),
        (
            "events/s accepted, median (per card)",
            _per_card(median(s.events_per_s for s in steady), r),
            "(28.6)",
        ),
        ("rate-limit answers (whole run)", f"{sum(s.rate_limited for s in r.samples)}", "0"),
        ("tasks created / finished", f"{r.created:,} / {r.finished:,}", ""),
        ("finals delivered (whole run, after the drain)", _fmt("{:.1f} %", r.finals_pct), "100 %"),
        ("runtime POSTs failed / creates failed", f"{r.post_errors} / {r.create_failures}", "0 / 0"),
    ]


def report(r: SoakResult) -> str:
    c = r.config
    lines = [
        f"### {c.cards:,} live cards for {c.seconds / 60:g} min, real time, {c.transport} transport",
        "",
        f"Tasks live {c.lifetime[0]:g}–{c.lifetime[1]:g} s each, then finish and are replaced; a sample "
        f"every {c.sample_seconds:g} s; the summary is over the samples after the "
        f"{c.warmup_seconds:g} s warm-up.",
        "",
        "| after warm-up | measured | target |",
        "|---|---:|---:|",
        *(f"| {what} | {measured} | {target} |" for what, measured, target in summary_rows(r)),
        "",
        "<details><summary>Every sample</summary>",
        "",
        HEADER,
        *(row(s) for s in r.samples),
        "",
        "</details>",
    ]
    return "\n".join(lines)


INTRO = (
    "## Soak: live cards for an hour (issue 27 item 6, `bench/soak.py`)\n\n"
    "Each slot holds one task streaming workload.py's default stream through the runtime API; it lives a "
    "random lifetime, finishes and is replaced, so the live count stays constant. The service runs as a "
    "process of its own; RSS and open fds come from /proc, event-loop lag p99 "
    "(`fp_event_loop_lag_seconds`) and staleness p99 (`fp_delivery_staleness_seconds`) from the increase of "
    "its histograms' buckets between two scrapes of its `/metrics`."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=1000, help="live cards held all along")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, help="the run's length in seconds (overrides --minutes)")
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument(
        "--lifetime-seconds", default="120,600", help="LOW,HIGH: a task lives uniform(LOW, HIGH)"
    )
    parser.add_argument(
        "--warmup-seconds", type=float, help="samples before it are not summarised (default HIGH)"
    )
    parser.add_argument("--transport", choices=("cardkit", "patch"), default="cardkit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    low, high = (float(x) for x in args.lifetime_seconds.split(","))
    config = SoakConfig(
        cards=args.cards,
        seconds=args.seconds if args.seconds is not None else args.minutes * 60,
        sample_seconds=args.sample_seconds,
        lifetime=(low, high),
        warmup=args.warmup_seconds,
        transport=args.transport,
        seed=args.seed,
    )
    print(HEADER, flush=True)
    result = asyncio.run(run_soak(config, progress=True))
    text = report(result)
    print("\n" + text + "\n", flush=True)
    if not args.no_write:
        write_section(f"soak-{config.cards}", INTRO + "\n\n" + text)


if __name__ == "__main__":
    main()
