"""Micro benchmark: the task state's hot path (a batch applied and handed to the live card) and a snapshot.

    python bench/state_micro.py --runs 5
    PYTHONPATH=<another checkout> python bench/state_micro.py --runs 5   # its baseline, same machine

Per run (CPU time of this process over a loop, so a busy machine that deschedules it skews less; then the
median of the runs):
   - a text batch: 7 content_delta events applied, the batch ended, ``card.record(state.card_state())``;
   - a tool batch: tool_started, 5 tool_args, tool_finished, the same way (20 calls held before);
   - a snapshot of a task holding 30 finished calls (400-byte results): ``to_snapshot()``, and its size.
Only the public API of TaskState and LiveCard, so an older checkout runs it unchanged.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping
from typing import Any

from feishu_progress.cards.builder import BuiltCard
from feishu_progress.feishu.patch_writer import PatchWriter
from feishu_progress.ports import SystemClock
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.state import TaskState


class _NoClient:
    """Nothing is written here: the bench measures applying events and snapshots."""

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None:
        raise AssertionError("state_micro writes no card")


def held(tools: int) -> tuple[TaskState, LiveCard]:
    state = TaskState(session_id=1, requester_open_id="ou", receive_id="oc", receive_id_type="chat_id")
    state.apply(ev.StatusEvent(type="status", status="RUNNING", round=1))
    for i in range(tools):
        args = {"command": "ls -la " * 8}
        state.apply(ev.ToolStartedEvent(type="tool_started", call_id=f"old{i}", name="shell", args=args))
        result = {"stdout": "x" * 400}
        state.apply(ev.ToolFinishedEvent(type="tool_finished", call_id=f"old{i}", result=result))
    state.apply(ev.ContentEvent(type="content", text="正文" * 500))
    card = LiveCard(
        CardContext(1, "om"),
        writer=PatchWriter(_NoClient(), "om", interval=0.25),
        clock=SystemClock(),
        build_card=lambda m: BuiltCard({}),
        build_degraded_card=lambda m: BuiltCard({}),
    )
    return state, card


TEXT: list[ev.Event] = [ev.ContentDeltaEvent(type="content_delta", text="流式文本。" * 4) for _ in range(7)]


def tool_batch(i: int) -> list[ev.Event]:
    call = f"c{i}"
    return [
        ev.ToolStartedEvent(type="tool_started", call_id=call, name="shell", args={"command": "p"}),
        *(
            ev.ToolArgsEvent(type="tool_args", call_id=call, args={"command": "pytest -q " * k})
            for k in range(5)
        ),
        ev.ToolFinishedEvent(type="tool_finished", call_id=call, result={"exit_code": 0, "stdout": "ok"}),
    ]


def per_batch(kind: str, loops: int) -> float:
    state, card = held(20)
    batches = [TEXT if kind == "text" else tool_batch(i) for i in range(loops)]
    start = time.process_time()
    for batch in batches:
        for event in batch:
            state.apply(event)
        state.end_batch(1.0)
        card.record(state.card_state())
    return (time.process_time() - start) / loops * 1e6


def per_snapshot(loops: int) -> tuple[float, int]:
    state, _ = held(30)
    text = ""
    start = time.process_time()
    for _ in range(loops):
        text = state.to_snapshot()
    return (time.process_time() - start) / loops * 1e6, len(text.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--loops", type=int, default=20_000, help="text batches per run (tool: ÷4, snapshot: ÷20)"
    )
    args = parser.parse_args()
    text = statistics.median(per_batch("text", args.loops) for _ in range(args.runs))
    tool = statistics.median(per_batch("tool", args.loops // 4) for _ in range(args.runs))
    snapshots = [per_snapshot(args.loops // 20) for _ in range(args.runs)]
    snapshot = statistics.median(us for us, _ in snapshots)
    print(
        f"text batch {text:.1f} us | tool batch {tool:.1f} us | "
        f"snapshot {snapshot:.1f} us, {snapshots[0][1]:,} bytes (medians of {args.runs} runs)"
    )


if __name__ == "__main__":
    main()
