"""Callback latency as the server sees it: the service in its own process, the clicks from this one.

    python bench/callbacks.py --bursts 20,200 --tasks 20,200 --runs 3 --pin

Per run: the SERVICE (``create_app``, SQLite in a temp dir, an encrypt key and a verification token, so
a click is checked and decrypted exactly as Feishu sends it) starts in a spawned process; this process
serves the sandbox (Feishu's side) and creates N running tasks through the API (N: each of ``--tasks``).
Then, for each burst size B, one warm-up burst of B clicks (it opens the B keep-alive connections a
burst uses, so connection set-up is not timed) and one measured burst: B concurrent
``card.action.trigger`` clicks (dislike by the requester, spread over the tasks), each signed and
encrypted before the clock starts, posted to /feishu/callback; latency is perf_counter around each
POST at the client.

With ``--pin`` the service runs alone on core 0 and this process (clients + sandbox) on core 1, so the
figure is the server's and not the client's CPU fighting it. Per burst size: p50/p99/max per run, then
the median of the runs with min–max.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

from bench.common import median, percentile, write_section
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.web.http import serving

APP_ID, APP_SECRET = "cli_bench_callbacks", "bench-callbacks-secret"
ENCRYPT_KEY, VERIFICATION_TOKEN = "bench-encrypt-key", "bench-verification-token"
API_TOKEN = "bench-api-token"
REQUESTER, CHAT = "ou_bench", "oc_bench_chat"
SERVICE_CORE, CLIENT_CORE = 0, 1
TARGET_P99_MS = {20: 50.0, 200: 250.0}
BURST_PAUSE_SECONDS = 1.0  # lets the previous burst's card updates settle before the next burst


# --- the service process ---------------------------------------------------------------------------


def _serve_service(queue: Any, sandbox_url: str, workdir: str, cores: set[int] | None) -> None:
    if cores is not None:
        os.sched_setaffinity(0, cores)
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    from feishu_progress.app import create_app
    from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
    from feishu_progress.gc_policy import settle_after_startup

    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{Path(workdir) / 'callbacks.db'}",
        feishu=FeishuSettings(
            base_url=sandbox_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            encrypt_key=ENCRYPT_KEY,
            verification_token=VERIFICATION_TOKEN,
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=API_TOKEN),
    )

    async def serve() -> None:
        app = create_app(settings)
        settle_after_startup(app)  # as `feishu-progress serve` does
        async with serving(app) as base_url:
            queue.put(base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


# --- the clients -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Burst:
    clicks: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    failures: int  # answers other than 200


async def create_task(http: aiohttp.ClientSession, base: str, index: int) -> tuple[int, str]:
    """A running task (session_id, message_id) the clicks can land on."""
    body = {
        "receive_id": CHAT,
        "receive_id_type": "chat_id",
        "requester_open_id": REQUESTER,
        "title": f"回调压测 {index}",
    }
    async with http.post(f"{base}/v1/tasks", json=body) as response:
        data = await response.json()
    session_id, message_id = int(data["session_id"]), str(data["message_id"])
    running = {"events": [{"type": "status", "status": "RUNNING", "round": 1}]}
    async with http.post(f"{base}/v1/tasks/{session_id}/events", json=running) as response:
        await response.read()
    return session_id, message_id


def signed_click(session_id: int, message_id: str) -> tuple[bytes, dict[str, str]]:
    """One dislike click, signed and encrypted as Feishu sends it (a fresh token each)."""
    now = time.time()
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=message_id,
        chat_id=CHAT,
        value={"v": 1, "action": "dislike", "session_id": session_id},
        verification_token=VERIFICATION_TOKEN,
        now=now,
        click_token=f"tok-{random.randrange(2**48):x}",
    )
    return signed_request(payload, encrypt_key=ENCRYPT_KEY, now=now)


async def post_click(
    http: aiohttp.ClientSession, base: str, request: tuple[bytes, dict[str, str]]
) -> tuple[float, int]:
    body, headers = request
    started = time.perf_counter()
    async with http.post(f"{base}/feishu/callback", data=body, headers=headers) as response:
        await response.read()
        return (time.perf_counter() - started) * 1000, response.status


async def burst(http: aiohttp.ClientSession, base: str, tasks: list[tuple[int, str]], clicks: int) -> Burst:
    """``clicks`` concurrent clicks, every one prepared (signed, encrypted) before the first is sent."""
    requests = [signed_click(*random.choice(tasks)) for _ in range(clicks)]
    results = await asyncio.gather(*(post_click(http, base, r) for r in requests))
    latencies = [ms for ms, _ in results]
    failures = sum(1 for _, status in results if status != 200)
    return Burst(clicks, percentile(latencies, 50), percentile(latencies, 99), max(latencies), failures)


async def one_run(tasks: int, sizes: list[int], *, pin: bool = False) -> list[Burst]:
    """A fresh service process; for each size a warm-up burst, then the measured one."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    service_cores, client_cores = ({SERVICE_CORE}, {CLIENT_CORE}) if pin else (None, None)
    previous = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory(prefix="fp-bench-callbacks-") as workdir:
        async with run_sandbox(SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)) as sandbox:
            process = context.Process(
                target=_serve_service, args=(queue, sandbox.base_url, workdir, service_cores), daemon=True
            )
            process.start()
            if client_cores is not None:
                os.sched_setaffinity(0, client_cores)
            try:
                base = await asyncio.to_thread(queue.get, timeout=60)
                return await _bursts(base, tasks, sizes)
            finally:
                os.sched_setaffinity(0, previous)
                process.terminate()
                process.join(10)


async def _bursts(base: str, tasks: int, sizes: list[int]) -> list[Burst]:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    connector = aiohttp.TCPConnector(limit=max(sizes))
    async with aiohttp.ClientSession(headers=headers, connector=connector) as http:
        created = [await create_task(http, base, i) for i in range(tasks)]
        measured = []
        for size in sizes:
            await burst(http, base, created, size)  # warm-up: opens the connections, warms the route
            await asyncio.sleep(BURST_PAUSE_SECONDS)
            measured.append(await burst(http, base, created, size))
            await asyncio.sleep(BURST_PAUSE_SECONDS)
        return measured


# --- the table -------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def table(runs: dict[int, list[list[Burst]]], sizes: list[int], pin: bool) -> str:
    """One row per (running tasks, burst size): medians of the runs with min–max."""
    where = (
        f"service pinned to core {SERVICE_CORE}, clients + sandbox on core {CLIENT_CORE}"
        if pin
        else "service and clients in separate processes, not pinned"
    )
    count = max(len(r) for r in runs.values())
    lines = [
        "## Callbacks: concurrent signed, encrypted clicks, the service in its own process "
        "(`bench/callbacks.py`)",
        "",
        f"Clicks (dislike by the requester) spread at random over the running tasks, {where}; latency at "
        f"the client, after a warm-up burst of the same size. Medians of {count} run(s), min–max in "
        "brackets. Feishu's deadline is 3 000 ms. Clicks on one card are applied one after the other "
        "(each waits for its action-log write), so fewer cards means longer queues.",
        "",
        "| running tasks | concurrent clicks | p50 ms | p99 ms | max ms | non-200 answers | p99 target |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tasks, task_runs in runs.items():
        for index, size in enumerate(sizes):
            bursts = [run[index] for run in task_runs]
            target = TARGET_P99_MS.get(size)
            lines.append(
                f"| {tasks} | {size} | {spread([b.p50_ms for b in bursts])} | "
                f"{spread([b.p99_ms for b in bursts])} | {spread([b.max_ms for b in bursts])} | "
                f"{sum(b.failures for b in bursts)} | {f'≤ {target:g} ms' if target else '—'} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bursts", default="20,200", help="comma-separated concurrent click counts")
    parser.add_argument("--tasks", default="20,200", help="comma-separated running task counts")
    parser.add_argument("--pin", action="store_true", help="service on core 0, clients + sandbox on core 1")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    sizes = [int(x) for x in args.bursts.split(",") if x.strip()]
    runs: dict[int, list[list[Burst]]] = {}
    for tasks in [int(x) for x in args.tasks.split(",") if x.strip()]:
        runs[tasks] = []
        for run in range(args.runs):
            runs[tasks].append(asyncio.run(one_run(tasks, sizes, pin=args.pin)))
            summary = ", ".join(
                f"{b.clicks}: p50 {b.p50_ms:.1f} p99 {b.p99_ms:.1f} max {b.max_ms:.1f} ms "
                f"({b.failures} non-200)"
                for b in runs[tasks][-1]
            )
            print(f"{tasks} tasks, run {run + 1}: {summary}", flush=True)
    text = table(runs, sizes, args.pin)
    print("\n" + text)
    if not args.no_write:
        write_section("callbacks", text)


if __name__ == "__main__":
    main()
