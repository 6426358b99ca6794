"""Benchmark: text freshness — from a content delta's 202 to the first card that shows it, CardKit vs PATCH.

    python bench/freshness.py --sizes 1,100,1000 --runs 3

For each size N and each transport (``cardkit``, ``patch``) in the same run: N tasks are created and put
RUNNING, then every card gets a ``content_delta`` every 0.3–0.5 s (``--every-ms``) carrying a unique
marker ``⟦card:k⟧``. A delta's FRESHNESS is the time from the moment its runtime POST was answered 202 to
the first card the sandbox accepted for that message (a streamed element text or a whole card) whose JSON
holds the marker. SEEN is the share of answered deltas that some card ever showed before the drain ended.
What is timed is Feishu accepting the text; CardKit's client-side typewriter (``print_frequency_ms``,
``print_step``) then types it out, a display delay this benchmark does not count.

Three processes per run, as in load.py: the SANDBOX, the SERVICE (``create_app``, SQLite in a temp dir,
``FP_CARD__TRANSPORT`` set per run) and this process, the RUNTIME CLIENTS (one coroutine per card, one POST
in flight). The sandbox scans its own message histories (the card of every accepted update, with its
arrival time) and answers marker → first time; its clock and ours are both CLOCK_MONOTONIC × scale
(bench/common.py ScaledClock), so the two times compare directly. Figures are in scaled seconds.

TIME IS SCALED for N=1000 (×5, like load.py): the service's budgets, pacing and the sandbox's limits run
in scaled time while the runtime posts in real time, so each card then gets a delta every 0.3–0.5 REAL s
× ``SLOWER`` (fewer POSTs for two shared cores; cards are budget-bound there, so they always have news).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import random
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ScaledClock, median, percentile, write_section

APP_ID = "cli_fresh"
APP_SECRET = "fresh-secret"
API_TOKEN = "fresh-api-token"
TRANSPORTS = ("cardkit", "patch")
BUDGET_PER_SECOND = 1000 / 60  # both APIs: 1000 writes per minute per app
CREATE_CONCURRENCY = 64
CREATE_ATTEMPTS = 20
DEFAULT_SECONDS = 25.0
DEFAULT_SCALE = {1: 1.0, 100: 1.0, 1000: 5.0}
SLOWER = {1000: 5.0}  # real-time delta interval multiplier (see the docstring)
MARKER = re.compile(r"⟦(\d+:\d+)⟧")  # a delta's text
PANEL_MARKER = re.compile(r"⟪(\d+:\d+)⟫")  # a tool call's path: its row on the card is a panel change


# --- the sandbox process ---------------------------------------------------------------------------


def first_seen(
    history: list[tuple[float, Mapping[str, Any]]], offset: float, pattern: re.Pattern[str] = MARKER
) -> dict[str, float]:
    """Marker (``pattern``'s) → the (shifted) time of the first card in ``history`` whose JSON holds it."""
    seen: dict[str, float] = {}
    for at, card in history:
        for marker in pattern.findall(json.dumps(card, ensure_ascii=False)):
            seen.setdefault(marker, at + offset)
    return seen


def _serve_sandbox(queue: Any, scale: float) -> None:
    from feishu_progress.sandbox.server import STATE_KEY, create_sandbox_app
    from feishu_progress.sandbox.state import Answer, SandboxConfig, SandboxState
    from feishu_progress.web.http import serving

    class BenchSandboxState(SandboxState):
        """Feishu's limits on updates; none on send and card create, so setting up 1000 tasks is quick."""

        def app_limit(self, endpoint: str) -> Answer | None:
            return None if endpoint in ("send", "card_create") else super().app_limit(endpoint)

    scaled = ScaledClock(scale)

    async def report(request: web.Request) -> web.Response:
        state = request.app[STATE_KEY]
        offset = scaled.monotonic() - state.now()  # sandbox time counts from its start
        seen: dict[str, float] = {}
        panels: dict[str, float] = {}
        for message in state.messages.values():
            seen.update(first_seen(message.history, offset))
            panels.update(first_seen(message.history, offset, PANEL_MARKER))
        return web.json_response({"seen": seen, "panels": panels, "rate_limited": state.rate_limited()})

    async def serve() -> None:
        config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)
        app = create_sandbox_app(config, clock=scaled.monotonic)
        app[STATE_KEY] = BenchSandboxState(config, scaled.monotonic)
        app.router.add_get("/_bench/freshness", report)
        async with serving(app) as base_url:
            queue.put(base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


# --- the service process ---------------------------------------------------------------------------


def _serve_service(
    queue: Any, sandbox_url: str, scale: float, transport: str, workdir: str, *, admin_port: int = 0
) -> None:
    """The service in this process; ``admin_port`` 0 is any free port (soak.py names one to scrape)."""
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    from feishu_progress.app import create_app
    from feishu_progress.config import (
        AdminSettings,
        ApiSettings,
        CardSettings,
        FeishuSettings,
        HttpSettings,
        Settings,
        TaskSettings,
    )
    from feishu_progress.gc_policy import settle_after_startup
    from feishu_progress.web.http import serving

    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{Path(workdir) / 'fresh.db'}",
        feishu=FeishuSettings(
            base_url=sandbox_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            verification_token="fresh-verification-token",
            timeout_seconds=30,
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=admin_port),
        task=TaskSettings(stale_after=10**7),  # scaled setup must not close tasks as 失去联系
        api=ApiSettings(token=API_TOKEN),
        card=CardSettings(transport=transport),  # type: ignore[arg-type]
    )

    async def serve() -> None:
        app = create_app(settings, clock=ScaledClock(scale))
        settle_after_startup(app)  # as `feishu-progress serve` does
        async with serving(app) as base_url:
            queue.put(base_url)
            await asyncio.Event().wait()

    asyncio.run(serve())


# --- one run -----------------------------------------------------------------------------------


@dataclass
class FreshnessResult:
    transport: str
    cards: int
    scale: float
    seconds: float
    deltas: int = 0  # answered 202
    seen_pct: float = math.nan
    p50: float = math.nan
    p90: float = math.nan
    p99: float = math.nan
    one_pass: float = math.nan  # scaled s to write every card once at the app budget
    rate_limited: int = 0
    post_errors: int = 0
    tools: int = 0  # tool calls answered 202 (``--tool-every``): their rows are the panel changes
    panel_seen_pct: float = math.nan
    panel_p50: float = math.nan
    panel_p99: float = math.nan


def _delays(answered: Mapping[str, float], seen: Mapping[str, float]) -> list[float]:
    return [seen[m] - t for m, t in answered.items() if m in seen]


def summarise(result: FreshnessResult, answered: Mapping[str, float], seen: Mapping[str, float]) -> None:
    """Fill the freshness figures from marker → 202 time and marker → first shown time (same clock)."""
    delays = _delays(answered, seen)
    result.deltas = len(answered)
    result.seen_pct = 100.0 * len(delays) / len(answered) if answered else math.nan
    result.p50, result.p90, result.p99 = (percentile(delays, q) for q in (50, 90, 99))


def summarise_panels(
    result: FreshnessResult, answered: Mapping[str, float], seen: Mapping[str, float]
) -> None:
    """The same for the tool rows: from a tool call's 202 to the first card that shows its row."""
    delays = _delays(answered, seen)
    result.tools = len(answered)
    result.panel_seen_pct = 100.0 * len(delays) / len(answered) if answered else math.nan
    result.panel_p50, result.panel_p99 = percentile(delays, 50), percentile(delays, 99)


class Runtime:
    """The runtime side: creates tasks and streams marked deltas; remembers when each was answered."""

    def __init__(self, http: aiohttp.ClientSession, service: str, clock: ScaledClock) -> None:
        self.http = http
        self.service = service
        self.clock = clock
        self.answered: dict[str, float] = {}
        self.tools_answered: dict[str, float] = {}
        self.errors = 0

    async def create(self, index: int) -> int:
        body = {
            "receive_id": f"oc_fresh_{index}",
            "receive_id_type": "chat_id",
            "requester_open_id": "ou_fresh",
            "title": f"新鲜度 {index}",
        }
        for _ in range(CREATE_ATTEMPTS):  # a busy service answers 503 with retry_after: do as it says
            async with self.http.post(f"{self.service}/v1/tasks", json=body) as response:
                if response.status == 201:
                    return int((await response.json())["session_id"])
                text = await response.text()
                if response.status != 503:
                    break
                await asyncio.sleep(float(json.loads(text).get("retry_after", 1)))
        raise RuntimeError(f"create answered {response.status}: {text[:200]}")

    async def post(self, session_id: int, *events: dict[str, Any]) -> bool:
        url = f"{self.service}/v1/tasks/{session_id}/events"
        try:
            async with self.http.post(url, json={"events": list(events)}) as response:
                await response.read()
                if response.status == 202:
                    return True
        except (aiohttp.ClientError, TimeoutError):
            pass
        self.errors += 1
        return False

    async def stream(
        self, index: int, session_id: int, every: tuple[float, float], until: float, tool_every: int = 0
    ) -> None:
        """Marked deltas; with ``tool_every`` N, every Nth also starts a tool call (a panel change)."""
        rng = random.Random(index)
        k = 0
        while True:
            await asyncio.sleep(rng.uniform(*every))
            if time.monotonic() >= until:
                return
            marker = f"{index}:{k}"
            events: list[dict[str, Any]] = [{"type": "content_delta", "text": f"⟦{marker}⟧ 第{k}段。"}]
            tool = bool(tool_every) and k % tool_every == 0
            if tool:  # its row shows the path: the panel marker
                args = {"path": f"⟪{marker}⟫.py"}
                events.append({"type": "tool_started", "call_id": f"t{k}", "name": "read_file", "args": args})
            if await self.post(session_id, *events):
                self.answered[marker] = self.clock.monotonic()
                if tool:
                    self.tools_answered[marker] = self.answered[marker]
            k += 1


async def _gather_bounded(coroutines: list[Any]) -> list[Any]:
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(coroutine: Any) -> Any:
        async with gate:
            return await coroutine

    return list(await asyncio.gather(*(one(c) for c in coroutines)))


async def one_run(
    transport: str,
    *,
    cards: int,
    seconds: float,
    scale: float,
    every: tuple[float, float],
    tool_every: int = 0,
) -> FreshnessResult:
    """One service + sandbox pair, ``cards`` live cards streaming for ``seconds`` real seconds."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    result = FreshnessResult(transport, cards, scale, seconds, one_pass=cards / BUDGET_PER_SECOND)
    with tempfile.TemporaryDirectory(prefix="fp-fresh-") as workdir:
        sandbox_proc = context.Process(target=_serve_sandbox, args=(queue, scale), daemon=True)
        sandbox_proc.start()
        procs = [sandbox_proc]
        try:
            # In a thread: runs may share one loop (the smoke test runs both transports at once).
            sandbox_url = await asyncio.to_thread(queue.get, True, 60)
            args = (queue, sandbox_url, scale, transport, workdir)
            procs.append(context.Process(target=_serve_service, args=args, daemon=True))
            procs[-1].start()
            service_url = await asyncio.to_thread(queue.get, True, 60)
            connector = aiohttp.TCPConnector(limit=256)
            headers = {"Authorization": f"Bearer {API_TOKEN}"}
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as http:
                runtime = Runtime(http, service_url, ScaledClock(scale))
                await _measure(runtime, sandbox_url, result, every, tool_every)
        finally:
            for proc in procs:
                proc.terminate()
                proc.join(10)
    return result


async def _measure(
    runtime: Runtime,
    sandbox_url: str,
    result: FreshnessResult,
    every: tuple[float, float],
    tool_every: int = 0,
) -> None:
    cards, scale = result.cards, result.scale
    sessions = await _gather_bounded([runtime.create(i) for i in range(cards)])
    running = {"type": "status", "status": "RUNNING", "round": 1}
    await _gather_bounded([runtime.post(sid, running) for sid in sessions])
    # Let one budget's worth of RUNNING cards go out first: the stream then meets a settled service.
    one_pass = cards / BUDGET_PER_SECOND / scale  # real seconds to write every card once
    await asyncio.sleep(max(1.0, one_pass))
    until = time.monotonic() + result.seconds
    streams = (runtime.stream(i, sid, every, until, tool_every) for i, sid in enumerate(sessions))
    await asyncio.gather(*streams)
    # Drain: wait (bounded) until every answered delta was shown, or two passes of the budget.
    deadline = time.monotonic() + max(3.0, 2 * one_pass + 2)
    while True:
        async with runtime.http.get(f"{sandbox_url}/_bench/freshness") as response:
            report = await response.json()
        texts_shown = set(runtime.answered) <= set(report["seen"])
        rows_shown = set(runtime.tools_answered) <= set(report["panels"])
        if (texts_shown and rows_shown) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    summarise(result, runtime.answered, report["seen"])
    summarise_panels(result, runtime.tools_answered, report["panels"])
    result.rate_limited = int(report["rate_limited"])
    result.post_errors = runtime.errors


# --- tables ------------------------------------------------------------------------------------

ROWS: list[tuple[str, str, str]] = [
    ("freshness p50 (scaled s)", "p50", "{:.3f}"),
    ("freshness p90 (scaled s)", "p90", "{:.3f}"),
    ("freshness p99 (scaled s)", "p99", "{:.3f}"),
    ("panel freshness p50 (tool row, scaled s)", "panel_p50", "{:.3f}"),
    ("panel freshness p99 (tool row, scaled s)", "panel_p99", "{:.3f}"),
    ("tool rows ever seen", "panel_seen_pct", "{:.1f} %"),
    ("one budget pass = cards ÷ 16.7/s (scaled s)", "one_pass", "{:.3f}"),
    ("deltas ever seen", "seen_pct", "{:.1f} %"),
    ("deltas answered 202", "deltas", "{:,.0f}"),
    ("rate-limit answers (230020, 99991400)", "rate_limited", "{:.0f}"),
    ("runtime POSTs failed", "post_errors", "{:.0f}"),
]


def _fmt(fmt: str, value: float) -> str:
    return "—" if isinstance(value, float) and math.isnan(value) else fmt.format(value)


def _cell(fmt: str, values: list[float]) -> str:
    """Median, with the min–max of the runs when there are several and they differ."""
    kept = [v for v in values if not math.isnan(v)]
    text = _fmt(fmt, median(kept))
    if len(kept) > 1 and min(kept) != max(kept):
        text += f" ({_fmt(fmt, min(kept))}–{_fmt(fmt, max(kept))})"
    return text


def table(cards: int, runs: Mapping[str, list[FreshnessResult]], every: tuple[float, float]) -> str:
    transports = tuple(runs)
    first = runs[transports[0]][0]
    scaled = f"time scaled ×{first.scale:g}" if first.scale != 1 else "real time (unscaled)"
    lines = [
        f"### {cards} live card(s) — {first.seconds:g} s real stream, {scaled}, a delta per card every "
        f"{every[0]:g}–{every[1]:g} real s, medians (min–max) of {len(runs[transports[0]])} run(s)",
        "",
        "| metric | " + " | ".join(transports) + " |",
        "|---|" + "---:|" * len(transports),
    ]
    for label, attr, fmt in ROWS:
        cells = [_cell(fmt, [float(getattr(r, attr)) for r in runs[t]]) for t in transports]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


INTRO = (
    "## Text freshness: from a delta's 202 to the card that shows it, CardKit vs PATCH "
    "(`bench/freshness.py`)\n\n"
    "Each card gets a `content_delta` with a unique marker; freshness = first sandbox-accepted card "
    "(streamed element text or whole card) holding the marker − the runtime POST's 202, on one clock "
    "(CLOCK_MONOTONIC × scale), in scaled seconds. Both transports run in the same invocation, alternating. "
    "Where time is scaled, the service's budgets and the sandbox's limits run ×scale; the runtime posts "
    "in real time. Seen = share of answered deltas some card showed before the drain ended. Both "
    "transports' writes share 1000/min per app, so once that binds a card is written once per budget "
    "pass (cards ÷ 16.7/s) and a delta waits for its card's next turn: p50 ≈ half a pass, p99 ≈ a pass."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,100,1000", help="comma-separated live card counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="real seconds of streaming")
    parser.add_argument("--scale", type=float, help="scaled seconds per real second (default per size)")
    parser.add_argument("--every-ms", default="300,500", help="min,max real ms between a card's deltas")
    parser.add_argument("--tool-every", type=int, default=0, help="every Nth delta starts a tool call too")
    parser.add_argument(
        "--transports", default=",".join(TRANSPORTS), help="comma-separated, of " + ",".join(TRANSPORTS)
    )
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    transports = [t for t in args.transports.split(",") if t.strip()]
    if not transports:
        parser.error("--transports: name at least one of " + ", ".join(TRANSPORTS))
    if unknown := set(transports) - set(TRANSPORTS):
        parser.error(f"--transports: unknown {', '.join(sorted(unknown))}")
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    low, high = (float(x) / 1000 for x in args.every_ms.split(","))
    tables = []
    for cards in sizes:
        scale = args.scale or DEFAULT_SCALE.get(cards, max(1.0, cards / 200))
        every = (low * SLOWER.get(cards, 1.0), high * SLOWER.get(cards, 1.0))
        runs: dict[str, list[FreshnessResult]] = {t: [] for t in transports}
        for run in range(args.runs):
            for transport in transports:
                started = time.monotonic()
                res = asyncio.run(
                    one_run(
                        transport,
                        cards=cards,
                        seconds=args.seconds,
                        scale=scale,
                        every=every,
                        tool_every=args.tool_every,
                    )
                )
                runs[transport].append(res)
                print(
                    f"{cards} cards run {run + 1} {transport}: p50/p90/p99 {res.p50:.2f}/{res.p90:.2f}/"
                    f"{res.p99:.2f} scaled s, seen {res.seen_pct:.1f} % of {res.deltas}, "
                    f"panels p50/p99 {res.panel_p50:.2f}/{res.panel_p99:.2f} of {res.tools}, "
                    f"rate-limited {res.rate_limited}, POST errors {res.post_errors} "
                    f"[{time.monotonic() - started:.0f} s]",
                    flush=True,
                )
        tables.append(table(cards, runs, every))
        print("\n" + tables[-1] + "\n", flush=True)
    if not args.no_write:
        write_section("freshness", INTRO)
        for cards, text in zip(sizes, tables, strict=True):
            write_section(f"freshness-{cards}", text)


if __name__ == "__main__":
    main()
