"""Benchmark: one app vs two under the same load: each app's budget use and fairness, and the app lookup.

    python bench/multi_app.py --tasks 100 --runs 3

The same load twice, back to back in each run: N live cards streaming (bench/load.py's runtime clients)
into our service with ONE app (``FP_FEISHU__*``, one sandbox), then with TWO apps (an apps file, two
sandboxes: two base URLs, each enforcing its own 50/s and 1000/min on PATCH), the tasks alternating
between the apps. Each sandbox is Feishu for its app, so budget use, Jain's index of PATCHes per card and
staleness are measured per app where the writes land (bench/load.py's definitions); "all" is over every
card of the run.

The app lookup: the service counts ``AppRegistry.get`` calls (every lookup of an app context) and times
``AppRegistry.get`` on its own running registry (``timeit``, min of 5 × 200 000). A task's scheduler is
bound when its card is attached, so on the event path only a ``tool_finished`` looks its app up (the
result's images are uploaded with the app's credentials). Cost per event = lookups per event × ns per
lookup.

The machine may be shared with other work: configurations alternate within each run and the table
shows medians (min–max) of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import jain, write_section
from bench.load import (
    API_TOKEN,
    APP_ID,
    BUDGET_PER_SECOND,
    DEFAULT_SCALE,
    DEFAULT_SECONDS,
    WARM_TASKS,
    Bench,
    RunResult,
    _delivery_metrics,
    _idle_cards,
    _serve_sandbox,
    _serve_service,
    finish_all,
    spread,
    stream_phase,
    wait_for_finals,
)

CONFIGS = {"one app": None, "two apps": ["research", "sales"]}  # None: FP_FEISHU__* (the app "default")


@dataclass
class MultiResult:
    """One configuration's run: per app (where its writes landed) and over the whole service."""

    config: str
    service: RunResult  # events/s, CPU: the service as a whole
    per_app: dict[str, RunResult] = field(default_factory=dict)
    all_jain: float = math.nan
    all_patches_per_s: float = math.nan
    lookups_per_task: float = math.nan
    lookups_per_event: float = math.nan
    lookup_ns: float = math.nan

    @property
    def lookup_ns_per_event(self) -> float:
        return self.lookups_per_event * self.lookup_ns


def _start(target: Any, *args: Any, **kwargs: Any) -> tuple[Any, str]:
    """A spawned process that puts its URL on a queue; (process, URL)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(queue, *args), kwargs=kwargs, daemon=True)
    process.start()
    return process, str(queue.get(timeout=60))


async def one_run(
    config: str, *, tasks: int, seconds: float, scale: float, flush: float, seed: int
) -> MultiResult:
    names = CONFIGS[config]
    processes = []
    with tempfile.TemporaryDirectory(prefix="fp-bench-apps-") as workdir:
        try:
            sandboxes: dict[str, str] = {}
            for name in names or ["default"]:
                app_id = APP_ID if names is None else f"{APP_ID}_{name}"
                process, sandboxes[name] = _start(_serve_sandbox, scale, app_id=app_id)
                processes.append(process)
            apps = None if names is None else sandboxes
            first = next(iter(sandboxes.values()))
            process, service = _start(_serve_service, "ours", first, scale, workdir, apps=apps)
            processes.append(process)
            return await _measure(
                config,
                service,
                sandboxes,
                names=names,
                tasks=tasks,
                seconds=seconds,
                scale=scale,
                flush=flush,
                seed=seed,
            )
        finally:
            for process in processes:
                process.terminate()
                process.join(10)


async def _measure(
    config: str,
    service: str,
    sandboxes: dict[str, str],
    *,
    names: list[str] | None,
    tasks: int,
    seconds: float,
    scale: float,
    flush: float,
    seed: int,
) -> MultiResult:
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    connector = aiohttp.TCPConnector(limit=256)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as http:
        bench = Bench(http, service, next(iter(sandboxes.values())), scale, apps=names)
        result = MultiResult(config, RunResult("ours", tasks, scale, seconds))
        before = await bench.stats()
        created = await _idle_cards(bench, result.service, tasks)
        mid = await bench.stats()
        streams, start, end = await stream_phase(
            bench, result.service, created, seconds=seconds, flush=flush, seed=seed
        )
        after = await bench.stats()
        await finish_all(bench, streams)
        async with http.get(f"{service}/_bench/lookup") as response:
            result.lookup_ns = float((await response.json())["ns"])
        result.lookups_per_task = (mid["app_lookups"] - before["app_lookups"]) / (tasks + WARM_TASKS)
        events = after["events"] - mid["events"]
        result.lookups_per_event = (after["app_lookups"] - mid["app_lookups"]) / max(1, events)
        cards = _cards_by_app(bench, created, sandboxes)
        ideal_drain = max(len(ids) for ids in cards.values()) / BUDGET_PER_SECOND
        reports, _ = await wait_for_finals(bench, cards, start, ideal_drain)
    counts: list[int] = []
    for (name, url), report in zip(sandboxes.items(), reports, strict=True):
        app = result.per_app[name] = RunResult("ours", len(cards[url]), scale, seconds)
        greens = sum(1 for m in cards[url] if report["messages"][m]["template"] == "green")
        app.finals_pct = 100.0 * greens / len(cards[url])
        app.rate_limit_230020 = int(report["responses"].get("230020", 0))
        app.rate_limit_429 = int(report["responses"].get("99991400", 0))
        _delivery_metrics(app, report, cards[url], start=start, end=end, tasks=len(cards[url]))
        counts += [sum(1 for t in report["messages"][m]["times"] if start <= t <= end) for m in cards[url]]
    result.all_jain = jain(counts)
    result.all_patches_per_s = sum(counts) / (end - start)
    return result


def _cards_by_app(
    bench: Bench, created: list[tuple[int, str]], sandboxes: dict[str, str]
) -> dict[str, set[str]]:
    """Sandbox URL → the message ids of the tasks created for its app (task i went to ``app_of(i)``)."""
    cards: dict[str, set[str]] = {url: set() for url in sandboxes.values()}
    for index, (_, message_id) in enumerate(created):
        cards[sandboxes[bench.app_of(index) or "default"]].add(message_id)
    return cards


# --- the table -------------------------------------------------------------------------------------

APP_ROWS: list[tuple[str, str, str]] = [
    ("budget use (demand > budget)", "budget_use_pct", "{:.1f} %"),
    ("Jain's index of PATCHes per card", "jain", "{:.3f}"),
    ("staleness p50 (scaled s)", "stale_p50", "{:.2f}"),
    ("staleness p99 (scaled s)", "stale_p99", "{:.2f}"),
    ("ideal staleness = the app's cards ÷ 16.7/s", "ideal", "{:.2f}"),
    ("rate-limit answers 230020 + 99991400", "rate_limits", "{:.0f}"),
    ("final states delivered", "finals_pct", "{:.1f} %"),
]
SERVICE_ROWS: list[tuple[str, str, str]] = [
    ("Jain's index over every card", "all_jain", "{:.3f}"),
    ("PATCHes delivered per scaled s (all apps)", "all_patches_per_s", "{:.1f}"),
    ("events/s accepted (real s)", "service.events_per_s", "{:,.0f}"),
    ("service CPU s per 1 000 events", "service.cpu_per_1k", "{:.3f}"),
    ("app lookups per task created", "lookups_per_task", "{:.2f}"),
    ("app lookups per event (stream phase)", "lookups_per_event", "{:.4f}"),
    ("ns per app lookup (`AppRegistry.get`)", "lookup_ns", "{:.0f}"),
    ("app lookup cost per event (ns)", "lookup_ns_per_event", "{:.2f}"),
]


def _value(obj: Any, path: str) -> float:
    if path == "rate_limits":
        return float(obj.rate_limit_230020 + obj.rate_limit_429)
    for part in path.split("."):
        obj = getattr(obj, part)
    return float(obj)


def table(tasks: int, runs: dict[str, list[MultiResult]], load: tuple[float, float] | None = None) -> str:
    one, two = runs["one app"], runs["two apps"]
    names = list(two[0].per_app) if two else []
    first = (one or two)[0].service
    n = max(len(one), len(two))
    lines = [
        f"### {tasks} live cards, one app vs two apps — {first.seconds:g} s real stream, time scaled "
        f"×{first.scale:g}, medians of {n} run(s) (min–max), configurations back to back in each run",
        "",
        "| per app | one app | " + " | ".join(f"two apps: {name}" for name in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for label, attr, fmt in APP_ROWS:
        cells = [spread(fmt, [_value(r.per_app["default"], attr) for r in one])]
        cells += [spread(fmt, [_value(r.per_app[name], attr) for r in two]) for name in names]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", "| whole service | one app | two apps |", "|---|---:|---:|"]
    for label, attr, fmt in SERVICE_ROWS:
        cells = [spread(fmt, [_value(r, attr) for r in group]) if group else "—" for group in (one, two)]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    if load is not None:
        lines.append(
            f"\n_The machine's 1-minute load average was {load[0]:.1f} when the runs began and "
            f"{load[1]:.1f} when they ended ({os.cpu_count()} cores, shared with other work)._"
        )
    return "\n".join(lines)


INTRO = (
    "## Several apps: one app vs two under the same load (`bench/multi_app.py`)\n\n"
    "The same N cards and event streams go to one app, then to two apps (tasks alternating; each app on "
    "its own sandbox, which enforces that app's 50/s and 1000/min on PATCH). Per-app rows are measured at "
    "each app's sandbox. The app lookup rows come from the service counting and timing `AppRegistry.get`. "
    "Run on a machine shared with other work: one-app and two-app runs alternate, medians of the runs."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100, help="live cards (split between the apps)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, help="real seconds of streaming (default: bench/load.py's)")
    parser.add_argument("--scale", type=float, help="scaled seconds per real second (default: load.py's)")
    parser.add_argument("--flush-ms", type=float, default=250, help="runtime client batching interval")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    seconds = args.seconds or DEFAULT_SECONDS.get(args.tasks, 30.0)
    scale = args.scale or DEFAULT_SCALE.get(args.tasks, max(1.0, args.tasks / 200))
    runs: dict[str, list[MultiResult]] = {config: [] for config in CONFIGS}
    load_before = os.getloadavg()[0]
    for run in range(args.runs):
        for config in CONFIGS:
            started = time.monotonic()
            res = asyncio.run(
                one_run(
                    config,
                    tasks=args.tasks,
                    seconds=seconds,
                    scale=scale,
                    flush=args.flush_ms / 1000,
                    seed=run,
                )
            )
            runs[config].append(res)
            apps = ", ".join(
                f"{name}: budget {a.budget_use_pct:.1f} % Jain {a.jain:.3f} finals {a.finals_pct:.0f} %"
                for name, a in res.per_app.items()
            )
            print(
                f"run {run + 1} {config}: {apps}; all Jain {res.all_jain:.3f}, "
                f"{res.all_patches_per_s:.1f} PATCH/s, {res.service.cpu_per_1k:.3f} CPU s/1k ev, "
                f"lookups {res.lookups_per_task:.2f}/task {res.lookups_per_event:.4f}/event at "
                f"{res.lookup_ns:.0f} ns [{time.monotonic() - started:.0f} s]",
                flush=True,
            )
    text = table(args.tasks, runs, (load_before, os.getloadavg()[0]))
    print("\n" + text + "\n")
    if not args.no_write:
        write_section("multi-app", INTRO)
        write_section(f"multi-app-{args.tasks}-x{scale:g}", text)


if __name__ == "__main__":
    main()
