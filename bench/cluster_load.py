"""Benchmark: 1, 2 and 3 service instances on one MariaDB database + one Redis, under the same load.

    python bench/cluster_load.py --instances 1,2,3 --tasks 200 --seconds 30 --runs 3

Every instance is a ``feishu-progress serve`` subprocess (tests/cluster_harness.py starts them, with the
sandbox as one more process), all in cluster mode (FP_REDIS_URL) on a fresh MariaDB database; Feishu's
limits are the sandbox's defaults (50/s and 1 000/min per app). This process plays the runtime: ``--tasks``
live cards, each streaming the realistic events of bench/workload.py, batched every ``--flush-ms``, each
batch POSTed to a random instance (a load balancer). Real time throughout (no scaled clock).

Measured per run, at the sandbox unless noted: events/s accepted (202) by the instances together; budget
use = card updates delivered in the stream window ÷ (1 000/min pro rata over it); Jain's index of updates
per card; rate-limit answers (230020, 99991400, 429); final states delivered; the instances' CPU s per
1 000 events (utime + stime from /proc). With 2 or more instances, the last one is killed with SIGKILL
halfway through the stream: TAKEOVER = seconds from the kill until every card it wrote last was updated
by another instance (the worst card; the median card in brackets). ``--pause S`` pauses it instead
(SIGSTOP for S seconds, then SIGCONT): takeover counts from the SIGSTOP, and STALE WRITES are updates
the paused instance sent, after it resumed, to a card another instance had written since the pause
(must be 0; a card nobody took meanwhile is the resumed instance's to write again), split into those
Feishu accepted and those it refused (a CardKit write below the taker's sequence). ``--redis-down S``
runs a redis-server of the bench's own and stops it for S seconds, 2 s after the kill or the SIGSTOP (a
Redis restart during the takeover: every instance falls back to its local share of the budget, then comes
back empty). ``--transport patch`` writes PATCHed messages instead of CardKit cards (a taken PATCHed
card waits out the dead writer's last write; a CardKit card does not need to).

(c) The cost of cluster mode: one instance with FP_REDIS_URL against one without (single mode), the
same load, CPU s per 1 000 events (``--cost-only`` runs only this part; ``--no-cost`` skips it).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import redis.asyncio as aioredis
from sqlalchemy.engine import make_url

from bench.common import jain, median, write_section
from bench.db import ensure_database
from bench.load import finals_poll_seconds
from bench.workload import TaskStream
from feishu_progress.domain import TaskStatus
from tests.cluster_checks import rate_limit_answers, takeover_seconds, undelivered_finals
from tests.cluster_harness import Cluster, ClusterOptions
from tests.redis_server import OwnRedis, own_redis_server

DEFAULT_MYSQL_URL = "mysql+aiomysql://root@127.0.0.1:3306/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"  # the bench's own database on the shared Redis
DATABASE_SUFFIX = "bench_cluster"
PER_MINUTE = 1000.0
CREATE_CONCURRENCY = 32
RETRY_SECONDS = 15.0  # a runtime retries a 503 (nothing applied: the database out of reach)
RETRY_PAUSE_SECONDS = 0.2
FINALS_GRACE_SECONDS = 30.0
READING = (
    "How to read it: the workload offers ~28 events/s per card; events/s is what the instances absorbed "
    "(answered 202: applied, or stored in the event log while the killed instance's cards wait for their "
    "taker), and CPU per event is the cost, every instance's idle work (heartbeats, lease renewals, "
    "scheduler, takeover scan) included. Takeover counts from the kill to another instance's first update "
    "of each of the victim's cards: the lease running out (≤ 5 s), the takeover scan (≤ 0.5 s), what is "
    "left of the dead writer's write timeout (2 s after its lease ran out), then the card's turn under the "
    "budget (cards ÷ 16.7/s between two updates of a card)."
)


@dataclass
class RunResult:
    instances: int
    cluster_mode: bool
    tasks: int
    seconds: float
    events_per_s: float = math.nan
    cpu_per_1k: float = math.nan
    budget_use_pct: float = math.nan
    jain: float = math.nan
    rate_limit_answers: int = 0
    finals_pct: float = math.nan
    takeover_max: float = math.nan
    takeover_median: float = math.nan
    stale_writes: float = math.nan  # --pause: the resumed instance's writes to cards taken from it
    stale_refused: float = math.nan  # ... that Feishu refused (a CardKit sequence below the taker's)
    refused_batches: int = 0  # 503s answered (then retried) and other failures
    notes: list[str] = field(default_factory=list)


# --- the database and Redis of a run ---------------------------------------------------------------


async def fresh_database(base: str) -> str:
    """``<base database>_bench_cluster``, dropped and created again, migrated; its URL."""
    return await ensure_database(base, f"{make_url(base).database or 'test'}_{DATABASE_SUFFIX}", fresh=True)


async def empty_redis(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, from /proc (a killed one cannot be read: sample it first)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the runtime -----------------------------------------------------------------------------------


class Runtime:
    """Creates the tasks and streams their events through the cluster's load balancer."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.accepted = 0
        self.refused = 0
        self.refusals: collections.Counter[str] = collections.Counter()  # by status or error
        self.answer_seconds: list[float] = []  # how long each answered batch took

    async def create(self, count: int) -> list[tuple[int, str]]:
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(index: int) -> tuple[int, str]:
            body = {
                "receive_id": f"oc_bench_{index}",  # one chat each: Feishu limits sends per chat
                "receive_id_type": "chat_id",
                "requester_open_id": "ou_bench",
                "title": f"集群压测 {index}",
            }
            async with gate:
                reply = await self.cluster.call("POST", "/v1/tasks", json=body, headers=Cluster.api_headers())
            if reply.status != 201:
                raise RuntimeError(f"create answered {reply.status}: {str(reply.body)[:200]}")
            return int(reply.body["session_id"]), str(reply.body["message_id"])

        return list(await asyncio.gather(*(one(i) for i in range(count))))

    async def send(self, session_id: int, events: list[dict[str, Any]]) -> None:
        """One batch to a random instance, retried (same Idempotency-Key) while it answers 503."""
        path = f"/v1/tasks/{session_id}/events"
        headers = Cluster.api_headers() | {"Idempotency-Key": uuid.uuid4().hex}
        deadline = time.monotonic() + RETRY_SECONDS
        while time.monotonic() < deadline:
            try:
                reply = await self.cluster.call("POST", path, json={"events": events}, headers=headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                reply, why = None, type(exc).__name__
            if reply is not None:
                self.answer_seconds.append(reply.seconds)
            if reply is not None and reply.status == 202:
                self.accepted += len(events)
                return
            self.refused += 1
            self.refusals[str(reply.status) if reply is not None else why] += 1
            await asyncio.sleep(RETRY_PAUSE_SECONDS)

    async def stream(self, session_id: int, task: TaskStream, flush: float, stop: asyncio.Event) -> None:
        await asyncio.sleep(random.uniform(0, flush))
        while not stop.is_set():
            events = task.due(time.monotonic())
            if events:
                await self.send(session_id, events)
            await asyncio.sleep(flush * random.uniform(0.8, 1.2))


# --- one run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunConfig:
    instances: int
    cluster_mode: bool
    tasks: int
    seconds: float
    flush: float
    seed: int
    kill: bool
    mysql_url: str
    redis_url: str
    pause: float = 0.0  # > 0: SIGSTOP the victim this long instead of killing it
    logs: Path | None = None
    transport: str = "cardkit"
    redis_down: float = 0.0  # > 0: the bench's own Redis, stopped this long 2 s after the kill (SIGSTOP)


async def one_run(config: RunConfig) -> RunResult:
    result = RunResult(config.instances, config.cluster_mode, config.tasks, config.seconds)
    database_url = await fresh_database(config.mysql_url)
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="fp-bench-cluster-") as tmp:
        own = stack.enter_context(own_redis_server()) if config.redis_down > 0 else None
        redis_url = (own.url if own is not None else config.redis_url) if config.cluster_mode else None
        if redis_url is not None:
            await empty_redis(redis_url)
        options = ClusterOptions(database_url, redis_url, env={"FP_CARD__TRANSPORT": config.transport})
        async with Cluster(Path(tmp), seed=config.seed) as cluster:
            await cluster.start(config.instances, options)
            await _measure(cluster, config, result, own)
        if config.logs is not None:  # each process's output, to see where a run's time went
            kept = (
                config.logs
                / f"{config.instances}-{'cluster' if config.cluster_mode else 'single'}-{config.seed}"
            )
            kept.mkdir(parents=True, exist_ok=True)
            for output in Path(tmp).glob("*.log"):
                shutil.copy(output, kept / output.name)
    return result


async def _batches_logged(cluster: Cluster) -> float:
    """Event batches the running instances stored for a writer that did not take them (cluster mode)."""
    total = 0.0
    for instance in cluster.instances:
        if instance.running:
            text = await cluster.metrics(instance.index)
            total += sum(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("fp_events_logged_total")
            )
    return total


async def _restart_redis(server: OwnRedis, down: float) -> None:
    """2 s after the kill, stop the bench's Redis for ``down`` seconds, then start an empty one."""
    await asyncio.sleep(2)
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(down)
    await asyncio.to_thread(server.start)


async def _measure(cluster: Cluster, config: RunConfig, result: RunResult, own: OwnRedis | None) -> None:
    runtime = Runtime(cluster)
    created = await runtime.create(config.tasks)
    rng = random.Random(config.seed)
    streams = {
        sid: TaskStream(i, time.monotonic(), random.Random(rng.random()))
        for i, (sid, _) in enumerate(created)
    }
    pids = {instance.index: instance.child.pid for instance in cluster.instances if instance.child}
    cpu_before = {index: cpu_seconds(pid) for index, pid in pids.items()}
    cpu_after: dict[int, float] = {}
    accepted_before = runtime.accepted
    stop = asyncio.Event()
    window_start = time.monotonic()
    loops = [asyncio.create_task(runtime.stream(sid, s, config.flush, stop)) for sid, s in streams.items()]
    killed_at = victim = resumed_at = None
    if config.kill and config.instances > 1:
        await asyncio.sleep(config.seconds / 2)
        victim_index = config.instances - 1
        victim = cluster.instances[victim_index].instance_id
        restart = None
        if own is not None:
            restart = asyncio.create_task(_restart_redis(own, config.redis_down))
        if config.pause > 0:
            killed_at = cluster.sigstop(victim_index)
            await asyncio.sleep(config.pause)
            resumed_at = cluster.sigcont(victim_index)
        else:
            cpu_after[victim_index] = cpu_seconds(pids[victim_index])
            killed_at = await cluster.kill9(victim_index)
        if restart is not None:
            await restart
        await asyncio.sleep(config.seconds - (time.monotonic() - window_start))
    else:
        await asyncio.sleep(config.seconds)
    stop.set()
    window_end = time.monotonic()
    for index, pid in pids.items():
        if index not in cpu_after:  # the killed one was sampled just before its kill
            cpu_after[index] = cpu_seconds(pid)
    await asyncio.gather(*loops)
    accepted = runtime.accepted - accepted_before
    result.events_per_s = accepted / (window_end - window_start)
    cpu = sum(cpu_after[i] - cpu_before[i] for i in pids)
    result.cpu_per_1k = cpu / accepted * 1000 if accepted else math.nan
    result.refused_batches = runtime.refused
    if runtime.answer_seconds:
        answered = sorted(runtime.answer_seconds)
        result.notes.append(
            f"batch answers: p99 {answered[int(len(answered) * 0.99)]:.2f} s, max {answered[-1]:.2f} s"
        )
    if runtime.refusals:
        result.notes.append("refused: " + ", ".join(f"{n} × {why}" for why, n in runtime.refusals.items()))
    logged = await _batches_logged(cluster)
    if logged:
        result.notes.append(f"{logged:.0f} batches stored in the event log")

    await asyncio.gather(*(runtime.send(sid, s.final()) for sid, s in streams.items()))
    log = await _wait_for_finals(cluster, {mid for _, mid in created}, config.tasks)
    messages = log["messages"]
    expected = {mid: TaskStatus.COMPLETED for _, mid in created}
    result.finals_pct = 100.0 * (len(expected) - len(undelivered_finals(messages, expected))) / len(expected)
    answers = rate_limit_answers(messages)
    result.rate_limit_answers = len(answers)
    if answers:  # printed, to tell a budget bug from a kill's side effect
        marks = f"stream {window_start:.3f}–{window_end:.3f}, kill at {killed_at or math.nan:.3f} ({victim})"
        print(f"rate-limit answers ({marks}):", *answers[:20], sep="\n  ", flush=True)
    _delivery(result, messages, window_start, window_end)
    if killed_at is not None and victim is not None:
        taken = takeover_seconds(messages, victim, killed_at)
        waits = list(taken.values())
        result.takeover_max = max(waits, default=math.nan)
        result.takeover_median = statistics.median(waits) if waits else math.nan
        if resumed_at is not None:
            stale = stale_writes(messages, victim, killed_at, resumed_at)
            result.stale_writes = sum(1 for update in stale if update.get("code") == 0)
            result.stale_refused = len(stale) - result.stale_writes


def stale_writes(
    messages: list[dict[str, Any]], victim: str, stopped: float, resumed: float
) -> list[dict[str, Any]]:
    """Updates the paused ``victim`` sent after it resumed to a card another instance had written since
    the pause (it had been taken: nobody died meanwhile, so it cannot be the victim's again). A card
    nobody took while it was paused is the victim's to write again, not a stale write."""
    stale = []
    for message in messages:
        others = [
            u["arrived"]
            for u in message["updates"]
            if u["arrived"] >= stopped and u.get("instance") != victim
        ]
        if others:
            since = max(resumed, min(others))
            stale += [u for u in message["updates"] if u.get("instance") == victim and u["arrived"] >= since]
    return stale


async def _wait_for_finals(cluster: Cluster, ours: set[str], tasks: int) -> dict[str, Any]:
    """The sandbox log once every card shows its final state (or after a bounded wait)."""
    deadline = time.monotonic() + FINALS_GRACE_SECONDS + 2 * tasks / (PER_MINUTE / 60)
    expected = dict.fromkeys(ours, TaskStatus.COMPLETED)
    while True:
        log = await cluster.sandbox_log()
        if not undelivered_finals(log["messages"], expected) or time.monotonic() > deadline:
            return log
        await asyncio.sleep(finals_poll_seconds(tasks))


def _delivery(result: RunResult, messages: list[dict[str, Any]], start: float, end: float) -> None:
    counts = [
        sum(1 for u in message["updates"] if u.get("code") == 0 and start <= u["arrived"] <= end)
        for message in messages
    ]
    # Pro rata: 1 000/min is 16.7/s sustained (a window shorter than a minute could burst more, at 50/s,
    # which a paced service never does: counting the whole 1 000 would halve a 30 s window's figure).
    allowed = PER_MINUTE / 60 * (end - start)
    result.budget_use_pct = 100.0 * sum(counts) / allowed
    result.jain = jain(counts)


# --- tables ----------------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = [
    ("events/s accepted (all instances)", "events_per_s", "{:,.0f}"),
    ("instances' CPU s per 1 000 events", "cpu_per_1k", "{:.3f}"),
    ("budget use", "budget_use_pct", "{:.1f} %"),
    ("Jain's index of updates per card", "jain", "{:.3f}"),
    ("rate-limit answers", "rate_limit_answers", "{:.0f}"),
    ("final states delivered", "finals_pct", "{:.1f} %"),
    ("takeover after kill -9 (--pause: SIGSTOP), worst card (s)", "takeover_max", "{:.1f}"),
    ("takeover after kill -9 (--pause: SIGSTOP), median card (s)", "takeover_median", "{:.1f}"),
    ("--pause: writes to taken cards after the resume, accepted", "stale_writes", "{:.0f}"),
    ("--pause: the same, refused by Feishu (stale CardKit sequence)", "stale_refused", "{:.0f}"),
    ("event batches answered 503 / failed (retried)", "refused_batches", "{:.0f}"),
]


def cell(fmt: str, results: list[RunResult], attr: str) -> str:
    values = [float(getattr(r, attr)) for r in results]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "—"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def table(title: str, columns: list[tuple[str, list[RunResult]]]) -> str:
    lines = [title, "", "| metric | " + " | ".join(name for name, _ in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for label, attr, fmt in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(fmt, runs, attr) for _, runs in columns) + " |")
    notes = sorted({note for _, runs in columns for r in runs for note in r.notes})
    lines += [f"\n_{note}_" for note in notes]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="1,2,3", help="comma-separated instance counts")
    parser.add_argument("--tasks", type=int, default=200, help="live cards")
    parser.add_argument("--seconds", type=float, default=30.0, help="real seconds of streaming")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flush-ms", type=float, default=250, help="runtime client batching interval")
    parser.add_argument("--mysql-url", default=DEFAULT_MYSQL_URL)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--no-kill", action="store_true", help="no kill -9 (no takeover figure)")
    parser.add_argument(
        "--pause", type=float, default=0.0, help="SIGSTOP the victim this many seconds instead of kill -9"
    )
    parser.add_argument(
        "--redis-down",
        type=float,
        default=0.0,
        help="stop the bench's own Redis this long, 2 s after the kill",
    )
    parser.add_argument("--transport", choices=("cardkit", "patch"), default="cardkit")
    parser.add_argument("--cost-only", action="store_true", help="only (c): 1 instance, cluster vs single")
    parser.add_argument("--no-cost", action="store_true", help="skip (c)")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    parser.add_argument("--logs", type=Path, help="keep every process's output under this directory")
    args = parser.parse_args()
    counts = [] if args.cost_only else [int(x) for x in args.instances.split(",") if x.strip()]

    def run(instances: int, cluster_mode: bool, seed: int) -> RunResult:
        config = RunConfig(
            instances,
            cluster_mode,
            args.tasks,
            args.seconds,
            args.flush_ms / 1000,
            seed,
            kill=not args.no_kill,
            mysql_url=args.mysql_url,
            redis_url=args.redis_url,
            pause=args.pause,
            logs=args.logs,
            transport=args.transport,
            redis_down=args.redis_down,
        )
        started = time.monotonic()
        result = asyncio.run(one_run(config))
        mode = "cluster" if cluster_mode else "single"
        print(
            f"{instances} instance(s) {mode} run {seed + 1}: {result.events_per_s:,.0f} ev/s, "
            f"{result.cpu_per_1k:.3f} CPU s/1k, budget {result.budget_use_pct:.1f} %, "
            f"Jain {result.jain:.3f}, "
            f"rate-limited {result.rate_limit_answers}, finals {result.finals_pct:.1f} %, takeover "
            f"{result.takeover_max:.1f}/{result.takeover_median:.1f} s, "
            f"stale {result.stale_writes:.0f} (+{result.stale_refused:.0f} refused), "
            f"refused {result.refused_batches} "
            f"[{time.monotonic() - started:.0f} s] {'; '.join(result.notes)}",
            flush=True,
        )
        return result

    scaling = {n: [run(n, True, seed) for seed in range(args.runs)] for n in counts}
    cost: dict[str, list[RunResult]] = {}
    if not args.no_cost:
        cost = {
            "single mode (no FP_REDIS_URL)": [run(1, False, seed) for seed in range(args.runs)],
            "cluster mode (FP_REDIS_URL)": [run(1, True, seed) for seed in range(args.runs)],
        }
    sections = []
    if scaling:
        title = (
            f"## Cluster: 1–{max(counts)} instances on one MariaDB + one Redis (`bench/cluster_load.py`)\n\n"
            f"{args.tasks} live cards streaming bench/workload.py events for {args.seconds:g} s (real time), "
            f"batched every {args.flush_ms:g} ms, each batch to a random instance; sandbox limits 50/s and "
            "1 000/min per app. With 2+ instances the last one is "
            + (f"paused (SIGSTOP) for {args.pause:g} s" if args.pause else "killed (SIGKILL)")
            + " halfway through. "
            f"Medians of {args.runs} run(s), min–max in brackets. The instances, MariaDB, Redis, the sandbox "
            "and the load generator share the machine's 2 cores.\n\n" + READING
        )
        columns = [(f"{n} instance{'s' if n > 1 else ''}", runs) for n, runs in scaling.items()]
        sections.append(("cluster-load", table(title, columns)))
    if cost:
        title = (
            "### (c) The cost of cluster mode: one instance with and without Redis "
            "(`bench/cluster_load.py`)\n\n"
            f"The same load ({args.tasks} live cards, {args.seconds:g} s) on one instance on MariaDB; "
            "cluster mode adds the shared budget (Redis), leases and heartbeats. Medians of "
            f"{args.runs} run(s), min–max in brackets."
        )
        sections.append(("cluster-cost", table(title, list(cost.items()))))
    for name, text in sections:
        print("\n" + text + "\n", flush=True)
        if not args.no_write:
            write_section(name, text)


if __name__ == "__main__":
    main()
