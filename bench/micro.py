"""Micro benchmarks: card build + JSON serialise (typical and worst case), callback latency under 200 clicks.

    python bench/micro.py --runs 3

1. ``build_progress_card`` + ``json.dumps`` as FeishuClient serialises it, timed with perf_counter
   loops (median per call over ``--loops`` calls, then the median of the runs) for:
   - a typical card: RUNNING, round 12, ~2 KB content, 6 tool calls, 2 running subagents;
   - a worst case: 500 tool calls, one with a 1 MB result, 10 000 running subagents, 1 MB content,
     3 pending questions with 100 options each.
2. Callback latency: the whole service in-process (like ``feishu_progress/demo.py``: SQLite in a temp
   dir, the sandbox on a free port), ``--tasks`` existing tasks, then ``--clicks`` concurrent signed and
   encrypted ``card.action.trigger`` callbacks (dislike by the requester, spread over the tasks) posted
   to /feishu/callback; latency is measured at the client, p50/p99/max per burst.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from aiohttp import web

from bench.common import percentile, write_section
from feishu_progress.app import create_app
from feishu_progress.cards.builder import build_progress_card
from feishu_progress.demo import API_TOKEN, APP_ID, APP_SECRET, ENCRYPT_KEY, VERIFICATION_TOKEN, demo_settings
from feishu_progress.domain import (
    AskOption,
    AskQuestion,
    CardModel,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig

REQUESTER = "ou_bench"
CHAT = "oc_bench_chat"


def typical_model() -> CardModel:
    tools = (
        ToolCall(
            "c1", "shell", {"command": "pytest -q tests/"}, {"exit_code": 0, "stdout": "42 passed"}, True
        ),
        ToolCall("c2", "web_search", {"query": "飞书卡片 限流"}, {"error": "无可用搜索凭据"}, True),
        ToolCall("c3", "read_file", {"path": "feishu_progress/cards/builder.py"}, "…" * 200, True),
        ToolCall("c4", "write_file", {"path": "a.py", "content": "x = 1\n" * 50}, {"ok": True}, True),
        ToolCall("c5", "grep", {"pattern": "render_current"}, "3 matches", True),
        ToolCall("c6", "shell", {"command": "ruff check ."}, None, False),
    )
    subagents = (
        SubagentSummary(11, "explorer", "排查卡片进度链路", "RUNNING", 2),
        SubagentSummary(12, "worker", "实现子代理展示", "RECOVERING", 4),
    )
    return CardModel(
        session_id=1,
        status=TaskStatus.RUNNING,
        round=12,
        content="我先梳理一下**进度卡**的更新链路,再派两个子代理并行处理。\n" * 30,
        title="调研飞书卡片限流并修复进度卡",
        tools=tools,
        subagents=subagents,
        elapsed_ms=192_000,
        session_detail_url="https://agent.example.com/sessions/1",
    )


def worst_model() -> CardModel:
    shell = ({"command": "pytest -k case " * 20}, {"exit_code": 2, "stdout": "x"})
    tools = (
        *(ToolCall(f"c{i}", "shell", *shell, True) for i in range(499)),
        ToolCall("big", "read_file", {"path": "huge.log"}, {"content": "日志" * 500_000}, True),
    )
    subagents = tuple(
        SubagentSummary(i, "explorer", f"子代理 {i}: " + "很长的标题" * 20, "RUNNING", i % 50)
        for i in range(10_000)
    )
    asks = (
        PendingAsk(
            "ask-1",
            tuple(
                AskQuestion(
                    f"问题 {q}?" * 10, tuple(AskOption(f"选项 {o}", "说明" * 20) for o in range(100)), q == 1
                )
                for q in range(3)
            ),
        ),
    )
    return CardModel(
        session_id=2,
        status=TaskStatus.RUNNING,
        round=999,
        content="# 巨大的输出\n" + "```python\n" + "print('飞书')\n" * 80_000,
        title="超" * 1000,
        tools=tools,
        subagents=subagents,
        elapsed_ms=86_400_000,
        pending_asks=asks,
        session_detail_url="https://agent.example.com/sessions/2",
    )


def serialise(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False, separators=(",", ":"))  # as FeishuClient sends it


def time_build(model: CardModel, loops: int) -> tuple[float, float, int]:
    """Median ms per build, per build + serialise, and the card's bytes."""
    builds, totals = [], []
    text = ""
    for _ in range(loops):
        t0 = time.perf_counter()
        card = build_progress_card(model)
        t1 = time.perf_counter()
        text = serialise(card)
        t2 = time.perf_counter()
        builds.append((t1 - t0) * 1000)
        totals.append((t2 - t0) * 1000)
    return statistics.median(builds), statistics.median(totals), len(text.encode())


async def callback_burst(tasks: int, clicks: int) -> tuple[float, float, float, int]:
    """p50, p99, max ms of ``clicks`` concurrent callbacks, and how many were not answered 200."""
    with tempfile.TemporaryDirectory(prefix="fp-bench-micro-") as tmp:
        async with run_sandbox(SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)) as sandbox:
            app = create_app(demo_settings(sandbox, Path(tmp)))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                host, port = runner.addresses[0][:2]
                base = f"http://{host}:{port}"
                headers = {"Authorization": f"Bearer {API_TOKEN}"}
                connector = aiohttp.TCPConnector(limit=clicks)
                async with aiohttp.ClientSession(headers=headers, connector=connector) as http:
                    created = [await _create(http, base, i) for i in range(tasks)]
                    bodies = [_click(*random.choice(created)) for _ in range(clicks)]
                    await _post(http, base, _click(*created[0]))  # warm the route
                    results = await asyncio.gather(*(_post(http, base, b) for b in bodies))
            finally:
                await runner.cleanup()
    latencies = [ms for ms, _ in results]
    failures = sum(1 for _, status in results if status != 200)
    return percentile(latencies, 50), percentile(latencies, 99), max(latencies), failures


async def _create(http: aiohttp.ClientSession, base: str, index: int) -> tuple[int, str]:
    body = {
        "receive_id": CHAT,
        "receive_id_type": "chat_id",
        "requester_open_id": REQUESTER,
        "title": f"t{index}",
    }
    async with http.post(f"{base}/v1/tasks", json=body) as response:
        data = await response.json()
    sid, mid = int(data["session_id"]), str(data["message_id"])
    async with http.post(
        f"{base}/v1/tasks/{sid}/events",
        json={"events": [{"type": "status", "status": "RUNNING", "round": 1}]},
    ) as response:
        await response.read()
    return sid, mid


def _click(session_id: int, message_id: str) -> tuple[bytes, dict[str, str]]:
    now = time.time()
    payload = card_action_payload(
        open_id=REQUESTER,
        message_id=message_id,
        chat_id=CHAT,
        value={"v": 1, "action": "dislike", "session_id": session_id},
        verification_token=VERIFICATION_TOKEN,
        now=now,
    )
    return signed_request(payload, encrypt_key=ENCRYPT_KEY, now=now)


async def _post(
    http: aiohttp.ClientSession, base: str, request: tuple[bytes, dict[str, str]]
) -> tuple[float, int]:
    body, headers = request
    t0 = time.perf_counter()
    async with http.post(f"{base}/feishu/callback", data=body, headers=headers) as response:
        await response.read()
        return (time.perf_counter() - t0) * 1000, response.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loops", type=int, default=200, help="builds per run for the typical card")
    parser.add_argument("--worst-loops", type=int, default=5, help="builds per run for the worst case")
    parser.add_argument("--tasks", type=int, default=20, help="existing tasks the clicks land on")
    parser.add_argument("--clicks", type=int, default=200, help="concurrent callbacks per burst")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    typical, worst = typical_model(), worst_model()
    builds: dict[str, list[tuple[float, float, int]]] = {"typical": [], "worst case": []}
    bursts = []
    for run in range(args.runs):
        builds["typical"].append(time_build(typical, args.loops))
        builds["worst case"].append(time_build(worst, args.worst_loops))
        bursts.append(asyncio.run(callback_burst(args.tasks, args.clicks)))
        print(
            f"run {run + 1}: typical {builds['typical'][-1]}, worst {builds['worst case'][-1]}, "
            f"callbacks p50/p99/max/failures {bursts[-1]}",
            flush=True,
        )
    lines = [
        "## Micro: card build + serialise, callback latency (`bench/micro.py`)",
        "",
        f"perf_counter loops ({args.loops} typical / {args.worst_loops} worst-case builds per run), "
        f"medians of {args.runs} run(s). Worst case: 500 tools (one with a 1 MB result), "
        "10 000 running subagents, ~1 MB content, 3 pending questions × 100 options.",
        "",
        "| card | build ms | build + json.dumps ms | card bytes |",
        "|---|---:|---:|---:|",
    ]
    for name, rows in builds.items():
        lines.append(
            f"| {name} | {statistics.median(r[0] for r in rows):.3f} | "
            f"{statistics.median(r[1] for r in rows):.3f} | {statistics.median(r[2] for r in rows):,.0f} |"
        )
    lines += [
        "",
        f"Callbacks: {args.clicks} concurrent signed + encrypted clicks (dislike) on {args.tasks} existing "
        "tasks, service in-process (client and server share one core), Feishu's deadline is 3 000 ms.",
        "",
        "| p50 ms | p99 ms | max ms | non-200 answers |",
        "|---:|---:|---:|---:|",
        f"| {statistics.median(b[0] for b in bursts):.1f} | {statistics.median(b[1] for b in bursts):.1f} | "
        f"{statistics.median(b[2] for b in bursts):.1f} | {sum(b[3] for b in bursts)} |",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_write:
        write_section("micro", text)


if __name__ == "__main__":
    main()
