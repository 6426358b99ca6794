"""A realistic agent's event stream, generated lazily: one step every 20–50 ms of real time.

A task cycles through rounds: ``status RUNNING`` with a streamed content delta, then tool calls
(``tool_started``, 5–20 ``tool_args`` with growing arguments, ``tool_finished``), now and then a
BACKGROUND subagent (``subagent_started``, later ``subagent_round``s and ``subagent_finished``), then
``round_finished``. ``due(now)`` returns every step whose time has come, so a runtime client that
flushes every few hundred milliseconds sends them as one batch (what a real runtime client does).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

TOOLS = ("shell", "read_file", "web_search", "write_file", "grep")
TOOLS_PER_ROUND = 4
SUBAGENT_PROBABILITY = 0.25
MAX_BATCH = 1000  # runtime/events.py MAX_EVENTS_PER_BATCH

Event = dict[str, Any]


class TaskStream:
    """The event stream of one simulated task."""

    def __init__(
        self, index: int, start: float, rng: random.Random, step_ms: tuple[int, int] = (20, 50)
    ) -> None:
        self.index = index
        self.rng = rng
        self.step_ms = step_ms
        self.next_at = start + rng.uniform(0, step_ms[1]) / 1000
        self.running: dict[str, int] = {}  # subagent task_id -> its round
        self._steps = self._script()
        self.subagents_started = 0
        self.generated = 0  # steps handed out by due()

    def due(self, now: float) -> list[Event]:
        """Every step due by ``now`` (at most MAX_BATCH - 8, leaving room for a final batch)."""
        out: list[Event] = []
        low, high = self.step_ms
        while self.next_at <= now and len(out) < MAX_BATCH - 8:
            out.append(next(self._steps))
            self.next_at += self.rng.uniform(low, high) / 1000
        self.next_at = max(self.next_at, now)
        self.generated += len(out)
        return out

    def final(self) -> list[Event]:
        """The end of the task: every running subagent finishes, then the task completes."""
        events: list[Event] = [
            {"type": "subagent_finished", "task_id": ref, "status": "COMPLETED", "total_rounds": rnd}
            for ref, rnd in self.running.items()
        ]
        self.running.clear()
        events.append({"type": "finished", "status": "COMPLETED", "content": f"任务 {self.index} 完成。"})
        return events

    def _script(self) -> Iterator[Event]:
        rng = self.rng
        round_no = 0
        call_no = 0
        while True:
            round_no += 1
            yield {"type": "status", "status": "RUNNING", "round": round_no}
            yield {"type": "content_delta", "text": f"第 {round_no} 轮:分析中间结果,继续调用工具。"}
            for _ in range(TOOLS_PER_ROUND):
                call_no += 1
                call_id = f"c{call_no}"
                name = rng.choice(TOOLS)
                yield {"type": "tool_started", "call_id": call_id, "name": name, "args": {}}
                command = ""
                for _ in range(rng.randint(5, 20)):
                    command += rng.choice(("pytest -q ", "tests/test_", "cards.py ", "--maxfail=1 ", "飞书 "))
                    yield {"type": "tool_args", "call_id": call_id, "args": {"command": command}}
                ok = rng.random() > 0.1
                result: Any = {"exit_code": 0, "stdout": "42 passed"} if ok else {"error": "命令超时"}
                yield {"type": "tool_finished", "call_id": call_id, "result": result}
                yield from self._subagent_steps(call_no)
            yield {"type": "round_finished", "round": round_no}

    def _subagent_steps(self, call_no: int) -> Iterator[Event]:
        rng = self.rng
        for ref in list(self.running):
            self.running[ref] += 1
            yield {"type": "subagent_round", "task_id": ref, "round": self.running[ref]}
            if self.running[ref] >= 4:
                del self.running[ref]
                yield {"type": "subagent_finished", "task_id": ref, "status": "COMPLETED", "total_rounds": 4}
        if rng.random() < SUBAGENT_PROBABILITY:
            ref = f"s{call_no}"
            self.running[ref] = 0
            self.subagents_started += 1
            yield {
                "type": "subagent_started",
                "task_id": ref,
                "child_session_id": f"child-{self.index}-{call_no}",
                "agent_type": rng.choice(("explorer", "worker")),
                "title": f"后台子代理: 排查第 {call_no} 步",
                "invocation_type": "BACKGROUND",
            }
