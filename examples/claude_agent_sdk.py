"""A Claude Agent SDK session on a live card: text, tools, a permission asked on the card, a question.

    pip install "feishu-progress[claude]"
    feishu-progress serve                                   # sandbox mode: http://127.0.0.1:8000
    python examples/claude_agent_sdk.py --offline --auto-answer

With ``ANTHROPIC_API_KEY`` set (and no ``--offline``) the SDK's bundled Claude Code runs the prompt in a
temporary directory; every tool it is not allowed outright goes through ``can_use_tool`` to the card.
``--offline`` replaces only the CLI: a scripted ``Transport`` speaking its stream-json protocol asks
permission for a Bash command and asks an ``AskUserQuestion`` question. ``--auto-answer`` approves and
picks the first option through the sandbox's signed-click endpoint. Configuration:
``FEISHU_PROGRESS_URL`` (default http://127.0.0.1:8000), ``FEISHU_PROGRESS_TOKEN`` (default FP_API__TOKEN).
"""

from __future__ import annotations

import os
import sys

# This file bears the SDK's name: run as a script, its folder comes first on the import path and would
# shadow the package. Drop it before importing the SDK.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _HERE]

import asyncio  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from typing import Any  # noqa: E402

from claude_agent_sdk import ClaudeAgentOptions, Transport  # noqa: E402

from feishu_progress.adapters import CardSession  # noqa: E402
from feishu_progress.adapters.claude import run_on_card  # noqa: E402
from feishu_progress.adapters.example_main import run_example  # noqa: E402

PROMPT = "Count the Python files here, then ask me which report format I want."
QUESTION = {"question": "Report format?", "header": "Format", "multiSelect": False,
            "options": [{"label": "Table", "description": "one row per directory"},
                        {"label": "Summary", "description": "one line"}]}  # fmt: skip


def message(kind: str, *content: dict[str, Any]) -> dict[str, Any]:
    role = "assistant" if kind == "assistant" else "user"
    body = {"role": role, "model": "offline", "content": list(content)}
    return {"type": kind, "message": body, "parent_tool_use_id": None, "session_id": "offline"}


class OfflineClaude(Transport):
    """Stands in for the Claude Code CLI: answers the SDK's control requests and plays a short session."""

    def __init__(self) -> None:
        self.out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.player: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    async def end_input(self) -> None:
        return None

    async def close(self) -> None:
        if self.player is not None:
            self.player.cancel()
        await self.out.put(None)

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        while (item := await self.out.get()) is not None:
            yield item

    async def write(self, data: str) -> None:
        for line in data.splitlines():
            sent = json.loads(line)
            if sent["type"] == "control_request":  # initialize, interrupt: acknowledged
                reply = {"subtype": "success", "request_id": sent["request_id"], "response": {}}
                await self.out.put({"type": "control_response", "response": reply})
            elif sent["type"] == "control_response":  # the SDK's answer to can_use_tool
                self.answers[sent["response"]["request_id"]].set_result(sent["response"].get("response", {}))
            elif sent["type"] == "user" and self.player is None:
                self.player = asyncio.create_task(self.play())

    async def permission(self, tool: str, input: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
        self.answers[tool_use_id] = asyncio.get_running_loop().create_future()
        request = {"subtype": "can_use_tool", "tool_name": tool, "input": input, "tool_use_id": tool_use_id}
        await self.out.put({"type": "control_request", "request_id": tool_use_id, "request": request})
        return await self.answers[tool_use_id]

    async def play(self) -> None:
        put = self.out.put
        bash = {"command": "find . -name '*.py' | wc -l"}
        await put(message("assistant", {"type": "text", "text": "Counting the files. "},
                          {"type": "tool_use", "id": "t1", "name": "Bash", "input": bash}))  # fmt: skip
        allowed = (await self.permission("Bash", bash, "t1")).get("behavior") == "allow"
        result = "137" if allowed else "denied by the user"
        await put(message("user", {"type": "tool_result", "tool_use_id": "t1", "content": result,
                                   "is_error": not allowed}))  # fmt: skip
        asked = {"questions": [QUESTION]}
        await put(
            message("assistant", {"type": "tool_use", "id": "q1", "name": "AskUserQuestion", "input": asked})
        )
        answer = await self.permission("AskUserQuestion", asked, "q1")
        chosen = (answer.get("updatedInput") or {}).get("answers", {})
        await put(
            message("user", {"type": "tool_result", "tool_use_id": "q1", "content": json.dumps(chosen)})
        )
        text = f"{result} Python files; format: {chosen.get(QUESTION['question'], 'none')}."
        await put(message("assistant", {"type": "text", "text": text}))
        await put({"type": "result", "subtype": "success", "duration_ms": 1, "duration_api_ms": 1,
                   "is_error": False, "num_turns": 2, "session_id": "offline", "result": text})  # fmt: skip


async def run(card: CardSession, offline: bool) -> object:
    options = ClaudeAgentOptions(cwd=tempfile.mkdtemp(prefix="claude-example-"))
    result = await run_on_card(card, PROMPT, options, transport=OfflineClaude() if offline else None)
    return result.result if result else None


if __name__ == "__main__":
    sys.exit(run_example(__doc__ or "", run, title="Claude Agent SDK example", key_env="ANTHROPIC_API_KEY"))
