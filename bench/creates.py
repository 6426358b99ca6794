"""Benchmark: N creates against Feishu's send budget — no ``POST /v1/tasks`` waits past its bound (issue 27).

    python bench/creates.py --creates 10000 --transports patch,cardkit --scale 2

Three processes per transport, as in load.py and freshness.py: the SANDBOX with Feishu's default app
budgets ENFORCED on every API, send and CardKit card create included (50/s and 1000/min each; load.py
lifts the send limit, this benchmark is about it), the SERVICE (freshness.py's: ``create_app``, SQLite in
a temp dir, ``FP_CARD__TRANSPORT`` per run; ``FP_RATE__*`` set here), and this process, the RUNTIME
CLIENTS: ``--in-flight`` workers, each creating one task after another through the package's own client
(``feishu_progress.client.FeishuProgressClient``, what a Python runtime uses) with its own
Idempotency-Key per task, a 120 s timeout, and the client's retry of a 503 after its ``Retry-After``
with the same key. Workers share one client per 100 of them (aiohttp's connection limit per session),
so no request waits client-side for a connection. A create that gets no answer at all (the timeout) is
asked again with its key, as a runtime would.

TIME IS SCALED (``--scale``): the service, the sandbox and the clients share CLOCK_MONOTONIC × scale
(bench/common.py ScaledClock), so the budgets, the service's bound (``FP_RATE__CREATE_WAIT_SECONDS``), the
Retry-After sleeps and the client timeout all run in scaled seconds, and every time printed is in
scaled seconds. The scale multiplies the service's CPU time too: a request the service is slow to
answer for want of CPU looks ``scale`` times slower here, so keep the scale where the machine keeps up.

Checked per transport: the longest single request (≤ bound + ``--margin``); that every key made exactly
one task (the database's rows, and the same session id in every 201 of that key and in its row) and one
first card (one message per chat in the sandbox, the one its 201 named; with CardKit one card entity per
task); and that the sandbox answered no rate limit. Exits 1 when a property fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import freshness
from bench.common import ScaledClock, machine, percentile, write_section
from feishu_progress.client import ApiError, FeishuProgressClient, RetryPolicy, _Answer, _Request
from feishu_progress.config import RateSettings

TRANSPORTS = ("patch", "cardkit")
DEFAULT_CREATES = 10_000
DEFAULT_IN_FLIGHT = 500
DEFAULT_SCALE = 2.0  # where this 2-core machine keeps up: at 10 the service itself ran short of CPU
DEFAULT_MARGIN = 2.0  # scaled s past the bound: the request's own work (rows, the send) and a busy machine
FEISHU_PER_SECOND = 50.0  # Feishu's app budget of each Open API (docs/feishu-platform.md)
FEISHU_PER_MINUTE = 1000.0
CLIENT_TIMEOUT = 120.0  # scaled s: the runtime's timeout of one request (issue 27's client)
CLIENT_CONNECTIONS = 100  # aiohttp's default connection limit per session: one client per 100 workers
# Effectively "until served": the client follows every Retry-After; a key that is never served shows.
RETRY = RetryPolicy(attempts=1000, default_delay=1.0, max_delay=3600.0)
UNANSWERED_RETRIES = 3  # a create that got no answer (timeout, connection lost) is asked again this often
BUSY_WORDS = "budget is busy"  # in the 503's message when the wait for the budget was the reason


# --- the processes ---------------------------------------------------------------------------------


def _serve_sandbox(queue: Any, scale: float, per_second: float, per_minute: float) -> None:
    """The sandbox with its app budgets on every API (``per_*``; Feishu's by default), on the scaled clock."""
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    from feishu_progress.sandbox.server import create_sandbox_app
    from feishu_progress.sandbox.state import SandboxConfig
    from feishu_progress.web.http import serving

    config = SandboxConfig(
        app_id=freshness.APP_ID,
        app_secret=freshness.APP_SECRET,
        app_per_second=per_second,
        app_per_minute=per_minute,
    )

    async def serve() -> None:
        app = create_sandbox_app(config, clock=ScaledClock(scale).monotonic)
        async with serving(app) as base_url:
            queue.put(base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


def _serve_service(queue: Any, env: Mapping[str, str], *args: Any) -> None:
    """freshness.py's service, with the budget and the bound set as an operator would (``FP_RATE__*``)."""
    os.environ.update(env)
    freshness._serve_service(queue, *args)


def service_env(per_second: float, per_minute: float, bound: float) -> dict[str, str]:
    return {
        "FP_RATE__APP_PER_SECOND": f"{per_second:g}",
        "FP_RATE__APP_PER_MINUTE": f"{per_minute:g}",
        "FP_RATE__CREATE_WAIT_SECONDS": f"{bound:g}",
    }


# --- the runtime clients ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP request of a create, as the client saw it."""

    key: str
    took: float  # scaled s
    status: int | None  # None: no answer (the client's timeout, or the connection failed)
    retry_after: int | None = None
    busy: bool = False  # a 503 because the budget was busy (not another failure)
    session_id: int | None = None
    message_id: str | None = None


def attempt_of(key: str, took: float, answer: _Answer) -> Attempt:
    payload = answer.payload if isinstance(answer.payload, dict) else {}
    header = answer.retry_after_header
    return Attempt(
        key,
        took,
        answer.status,
        retry_after=int(header) if header is not None and header.isdigit() else None,
        busy=answer.status == 503 and BUSY_WORDS in str(payload.get("message", "")),
        session_id=payload.get("session_id") if answer.status == 201 else None,
        message_id=payload.get("message_id") if answer.status == 201 else None,
    )


class TimedClient(FeishuProgressClient):
    """The package's runtime client, unchanged, watching each request it makes.

    It retries a 503 itself and hands back only the final answer; the benchmark needs every attempt
    (its time, its Retry-After), so this overrides the one method that makes a single request.
    """

    def __init__(self, base_url: str, attempts: list[Attempt], clock: ScaledClock) -> None:
        super().__init__(
            base_url,
            freshness.API_TOKEN,
            retry=RETRY,
            clock=clock,
            timeout=CLIENT_TIMEOUT / clock.scale,  # aiohttp's timeout is in real seconds
        )
        self.attempts = attempts

    async def _send(self, request: _Request) -> _Answer:
        key = (request.headers or {}).get("Idempotency-Key", "")
        started = self.clock.monotonic()
        try:
            answer = await super()._send(request)
        except (TimeoutError, aiohttp.ClientError):
            self.attempts.append(Attempt(key, self.clock.monotonic() - started, None))
            raise
        self.attempts.append(attempt_of(key, self.clock.monotonic() - started, answer))
        return answer


def key_of(transport: str, index: int) -> str:
    return f"creates-{transport}-{index}"


def chat_of(index: int) -> str:
    return f"oc_creates_{index}"


async def create_one(client: FeishuProgressClient, transport: str, index: int) -> bool:
    """One task, as a runtime creates it: True once a 201 came (the client retried the 503s)."""
    for _ in range(UNANSWERED_RETRIES + 1):
        try:
            await client.create_task(
                receive_id=chat_of(index),
                receive_id_type="chat_id",
                requester_open_id="ou_creates",
                title=f"create {index}",
                idempotency_key=key_of(transport, index),
            )
        except (TimeoutError, aiohttp.ClientError):
            continue  # no answer at all: ask again with the same key, as a runtime would
        except ApiError:
            return False  # another error, or 503s past the client's attempts: the attempts show it
        return True
    return False


async def run_clients(
    service_url: str, transport: str, creates: int, in_flight: int, scale: float
) -> tuple[list[Attempt], list[int], float]:
    """Every create through ``in_flight`` workers; (attempts, failed indices, scaled s to create all)."""
    clock = ScaledClock(scale)
    attempts: list[Attempt] = []
    pending = iter(range(creates))  # shared by the workers: each takes the next task when it is done

    async def worker(client: FeishuProgressClient) -> list[int]:
        """The tasks this worker created one after another; the indices of those that failed."""
        return [index for index in pending if not await create_one(client, transport, index)]

    clients = [
        TimedClient(service_url, attempts, clock) for _ in range(math.ceil(in_flight / CLIENT_CONNECTIONS))
    ]
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        started = clock.monotonic()
        failed = await asyncio.gather(*(worker(clients[w // CLIENT_CONNECTIONS]) for w in range(in_flight)))
        seconds = clock.monotonic() - started
    return attempts, sorted(itertools.chain.from_iterable(failed)), seconds


# --- what the sandbox and the database hold ----------------------------------------------------------


async def sandbox_report(http: aiohttp.ClientSession, sandbox_url: str) -> dict[str, Any]:
    """The sandbox's counters and its message log (test-only endpoints, as the cluster checks read)."""
    async with http.get(f"{sandbox_url}/_sandbox/stats") as response:
        stats = dict(await response.json())
    async with http.get(f"{sandbox_url}/_sandbox/messages") as response:
        messages = (await response.json())["messages"]
    return {"stats": stats, "messages": messages}


def task_rows(workdir: str) -> list[tuple[int, str | None, str | None, str | None]]:
    """Every task row of the service's SQLite database: (session_id, key, message_id, card_id)."""
    (path,) = Path(workdir).glob("*.db")  # freshness.py's service names it
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        query = "SELECT session_id, idempotency_key, message_id, card_id FROM task_card"
        return list(db.execute(query).fetchall())


# --- one run -----------------------------------------------------------------------------------------


@dataclass
class CreatesResult:
    transport: str
    creates: int
    in_flight: int
    scale: float
    bound: float
    margin: float
    rate: float  # the send budget's sustained calls per (scaled) second
    longest: float = math.nan
    p50: float = math.nan
    p99: float = math.nan
    requests: int = 0
    busy_503: int = 0
    other_errors: int = 0  # answers other than 201 and a busy 503
    unanswered: int = 0  # the client's timeout, or a connection lost
    told_to_wait: int = 0  # keys answered at least one busy 503
    most_attempts: int = 0
    retry_after: list[int] = field(default_factory=list)
    seconds: float = math.nan
    failed: int = 0  # keys that never got a 201
    rate_limited: int = 0
    sends: int = 0
    card_creates: int = 0
    rows: int = 0
    key_mismatches: int = 0  # keys without exactly one row, or whose 201s and row name other tasks
    messages: int = 0
    duplicate_messages: int = 0  # messages beyond the first in one task's chat
    message_mismatches: int = 0  # keys whose chat does not show exactly the message their 201 named
    card_entities: int = 0

    @property
    def ideal(self) -> float:
        return self.creates / self.rate

    def problems(self) -> list[str]:
        """The properties issue 27 item 4 asks for that this run broke (empty: all held)."""
        checks = [
            (self.longest <= self.bound + self.margin, f"a request took {self.longest:.2f} s"),
            (self.failed == 0, f"{self.failed} keys never got their task"),
            (self.unanswered == 0, f"{self.unanswered} requests got no answer"),
            (
                self.rows == self.creates and self.key_mismatches == 0,
                f"{self.key_mismatches} keys ≠ one task",
            ),
            (self.duplicate_messages == 0, f"{self.duplicate_messages} duplicate first cards"),
            (self.message_mismatches == 0, f"{self.message_mismatches} keys ≠ one first card"),
            (self.rate_limited == 0, f"the sandbox answered {self.rate_limited} rate limits"),
        ]
        if self.transport == "cardkit":
            checks.append((self.card_entities == self.creates, f"{self.card_entities} card entities"))
        return [what for held, what in checks if not held]


def summarise_attempts(result: CreatesResult, attempts: list[Attempt]) -> None:
    took = [a.took for a in attempts]
    result.requests = len(attempts)
    result.longest = max(took, default=math.nan)
    result.p50, result.p99 = percentile(took, 50), percentile(took, 99)
    busy = [a for a in attempts if a.busy]
    result.busy_503 = len(busy)
    result.retry_after = sorted(a.retry_after for a in busy if a.retry_after is not None)
    result.told_to_wait = len({a.key for a in busy})
    result.unanswered = sum(1 for a in attempts if a.status is None)
    result.other_errors = sum(1 for a in attempts if a.status not in (None, 201) and not a.busy)
    result.most_attempts = max(Counter(a.key for a in attempts).values(), default=0)


def check_tasks(
    result: CreatesResult, attempts: list[Attempt], rows: list[Any], report: dict[str, Any]
) -> None:
    """Every key one task and one first card: its 201s, its row and its chat's messages all agree."""
    answered: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for a in attempts:
        if a.status == 201 and a.session_id is not None and a.message_id is not None:
            answered[a.key].add((a.session_id, a.message_id))
    by_key: dict[str | None, list[tuple[int, str | None]]] = defaultdict(list)
    for session_id, key, message_id, _card_id in rows:
        by_key[key].append((session_id, message_id))
    by_chat: dict[str, list[str]] = defaultdict(list)
    for message in report["messages"]:
        by_chat[message["chat_id"]].append(message["message_id"])
    result.rows = len(rows)
    result.messages = len(report["messages"])
    result.duplicate_messages = sum(len(ids) - 1 for ids in by_chat.values() if len(ids) > 1)
    for index in range(result.creates):
        key = key_of(result.transport, index)
        told = answered.get(key, set())
        if len(told) != 1 or by_key.get(key) != list(told):
            result.key_mismatches += 1
        if len(told) != 1 or by_chat.get(chat_of(index)) != [message for _, message in told]:
            result.message_mismatches += 1
    stats = report["stats"]
    result.rate_limited = int(stats["rate_limited"])
    result.sends = int(stats["requests"].get("send", 0))
    result.card_creates = int(stats["requests"].get("card_create", 0))
    result.card_entities = int(stats["cardkit"]["cards"])


async def one_run(
    transport: str,
    *,
    creates: int = DEFAULT_CREATES,
    in_flight: int = DEFAULT_IN_FLIGHT,
    scale: float = DEFAULT_SCALE,
    bound: float = RateSettings().create_wait_seconds,
    margin: float = DEFAULT_MARGIN,
    per_second: float = FEISHU_PER_SECOND,
    per_minute: float = FEISHU_PER_MINUTE,
) -> CreatesResult:
    """One sandbox + service pair and ``creates`` runtime creates against it."""
    rate = min(per_second, per_minute / 60.0)
    result = CreatesResult(transport, creates, in_flight, scale, bound, margin, rate)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="fp-creates-") as workdir:
        procs = [
            context.Process(target=_serve_sandbox, args=(queue, scale, per_second, per_minute), daemon=True)
        ]
        procs[0].start()
        try:
            # In a thread: runs may share one loop (the smoke test runs both transports at once).
            sandbox_url = await asyncio.to_thread(queue.get, True, 60)
            env = service_env(per_second, per_minute, bound)
            args = (queue, env, sandbox_url, scale, transport, workdir)
            procs.append(context.Process(target=_serve_service, args=args, daemon=True))
            procs[-1].start()
            service_url = await asyncio.to_thread(queue.get, True, 60)
            attempts, failed, result.seconds = await run_clients(
                service_url, transport, creates, in_flight, scale
            )
            async with aiohttp.ClientSession() as http:
                report = await sandbox_report(http, sandbox_url)
            rows = await asyncio.to_thread(task_rows, workdir)
        finally:
            for proc in procs:
                proc.terminate()
                proc.join(10)
    result.failed = len(failed)
    summarise_attempts(result, attempts)
    check_tasks(result, attempts, rows, report)
    return result


# --- tables ------------------------------------------------------------------------------------------


def _spread(values: list[int]) -> str:
    if not values:
        return "—"
    return f"{values[0]} / {percentile(values, 50):g} / {values[-1]}"


def _ratio(result: CreatesResult) -> str:
    return f"{result.seconds / result.ideal:.2f}×"


ROWS: list[tuple[str, Any]] = [
    # (label, the cell of one run)
    ("longest single request (scaled s)", lambda r: f"{r.longest:.2f}"),
    ("bound + margin (scaled s)", lambda r: f"{r.bound:g} + {r.margin:g}"),
    ("request p50 / p99 (scaled s)", lambda r: f"{r.p50:.2f} / {r.p99:.2f}"),
    ("requests made (first tries and retries)", lambda r: f"{r.requests:,}"),
    ("503s answered: budget busy", lambda r: f"{r.busy_503:,}"),
    ("keys told to come back (≥ 1 503)", lambda r: f"{r.told_to_wait:,}"),
    ("most requests for one key", lambda r: f"{r.most_attempts}"),
    ("Retry-After min / p50 / max (s)", lambda r: _spread(r.retry_after)),
    ("other error answers / no answer (timeout)", lambda r: f"{r.other_errors} / {r.unanswered}"),
    ("time to create all (scaled s)", lambda r: f"{r.seconds:.1f}"),
    ("ideal = creates ÷ send budget (scaled s)", lambda r: f"{r.ideal:.1f} (÷ {r.rate:.1f}/s)"),
    ("time ÷ ideal", _ratio),
    ("rate-limit answers at the sandbox", lambda r: f"{r.rate_limited}"),
    ("keys never served", lambda r: f"{r.failed}"),
    ("task rows / keys ≠ one task", lambda r: f"{r.rows:,} / {r.key_mismatches}"),
    (
        "messages / duplicates / keys ≠ one first card",
        lambda r: f"{r.messages:,} / {r.duplicate_messages} / {r.message_mismatches}",
    ),
    (
        "sends / card creates at the sandbox (uuid repeats included)",
        lambda r: f"{r.sends:,} / {r.card_creates:,}",
    ),
    ("CardKit card entities", lambda r: f"{r.card_entities:,}" if r.transport == "cardkit" else "—"),
    ("properties", lambda r: "all hold" if not r.problems() else "FAIL: " + "; ".join(r.problems())),
]


def table(runs: list[CreatesResult]) -> str:
    first = runs[0]
    lines = [
        f"### {first.creates:,} creates, {first.in_flight} in flight, time scaled ×{first.scale:g}, "
        f"bound {first.bound:g} s, budget {first.rate * 60:g}/min",
        "",
        "| metric | " + " | ".join(r.transport for r in runs) + " |",
        "|---|" + "---:|" * len(runs),
    ]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in runs) + " |" for label, cell in ROWS]
    return "\n".join(lines)


INTRO = (
    "## Creates never stall: N creates against Feishu's send budget (`bench/creates.py`)\n\n"
    "The sandbox enforces Feishu's default app budgets on every API (send and CardKit create: 50/s, "
    "1000/min). Runtime clients (the package's `FeishuProgressClient`, 120 s timeout, a 503 retried after "
    "its `Retry-After` with the same Idempotency-Key) create N tasks, `in flight` at a time. Time is "
    "scaled: every time is in scaled seconds, the service's bound (`FP_RATE__CREATE_WAIT_SECONDS`) too. "
    "A key's tasks and first cards are counted in the service's database and the sandbox's message log."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=DEFAULT_CREATES)
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated: patch,cardkit")
    parser.add_argument("--in-flight", type=int, default=DEFAULT_IN_FLIGHT, help="creates in flight at once")
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE, help="scaled seconds per real second")
    parser.add_argument("--bound", type=float, default=RateSettings().create_wait_seconds, help="scaled s")
    parser.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN, help="scaled s allowed past the bound"
    )
    parser.add_argument("--per-second", type=float, default=FEISHU_PER_SECOND, help="app budget of each API")
    parser.add_argument("--per-minute", type=float, default=FEISHU_PER_MINUTE, help="app budget of each API")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    print(f"{machine()}; time scaled ×{args.scale:g}, all times in scaled seconds", flush=True)
    runs = []
    for transport in transports:
        started = time.monotonic()
        result = asyncio.run(
            one_run(
                transport,
                creates=args.creates,
                in_flight=args.in_flight,
                scale=args.scale,
                bound=args.bound,
                margin=args.margin,
                per_second=args.per_second,
                per_minute=args.per_minute,
            )
        )
        runs.append(result)
        print(
            f"{transport}: {args.creates:,} creates in {result.seconds:.1f} scaled s "
            f"(ideal {result.ideal:.1f}), longest request {result.longest:.2f} s, {result.busy_503:,} 503s, "
            f"{'all properties hold' if not result.problems() else '; '.join(result.problems())} "
            f"[{time.monotonic() - started:.0f} real s]",
            flush=True,
        )
    text = table(runs)
    print("\n" + text + "\n", flush=True)
    if not args.no_write:
        write_section("creates", INTRO)
        write_section(f"creates-{args.creates}", text)
    if any(r.problems() for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
