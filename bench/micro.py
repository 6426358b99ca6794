"""Micro benchmark: card build + JSON serialise (typical and worst case).

    python bench/micro.py --runs 3

``build_progress_card`` + ``json.dumps`` as FeishuClient serialises it, timed with perf_counter loops
(median per call over ``--loops`` calls, then the median of the runs) for:
   - a typical card: RUNNING, round 12, ~2 KB content, 6 tool calls, 2 running subagents;
   - a worst case: 500 tool calls, one with a 1 MB result, 10 000 running subagents, 1 MB content,
     3 pending questions with 100 options each.

Click latency is measured by bench/callbacks.py, with the service in a process of its own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench.common import write_section
from feishu_progress.cards.builder import build_progress_card
from feishu_progress.domain import (
    AskOption,
    AskQuestion,
    CardModel,
    CardPanels,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)

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
        panels=CardPanels(status=TaskStatus.RUNNING, round=12, tools=tools),
        content="我先梳理一下**进度卡**的更新链路,再派两个子代理并行处理。\n" * 30,
        title="调研飞书卡片限流并修复进度卡",
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
        panels=CardPanels(status=TaskStatus.RUNNING, round=999, tools=tools, pending_asks=asks),
        content="# 巨大的输出\n" + "```python\n" + "print('飞书')\n" * 80_000,
        title="超" * 1000,
        subagents=subagents,
        elapsed_ms=86_400_000,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loops", type=int, default=200, help="builds per run for the typical card")
    parser.add_argument("--worst-loops", type=int, default=5, help="builds per run for the worst case")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    typical, worst = typical_model(), worst_model()
    builds: dict[str, list[tuple[float, float, int]]] = {"typical": [], "worst case": []}
    for run in range(args.runs):
        builds["typical"].append(time_build(typical, args.loops))
        builds["worst case"].append(time_build(worst, args.worst_loops))
        print(
            f"run {run + 1}: typical {builds['typical'][-1]}, worst {builds['worst case'][-1]}",
            flush=True,
        )
    lines = [
        "## Micro: card build + serialise (`bench/micro.py`)",
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
    text = "\n".join(lines)
    print("\n" + text)
    if not args.no_write:
        write_section("micro", text)


if __name__ == "__main__":
    main()
