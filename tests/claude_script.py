"""A scripted Claude Code for the Claude Agent SDK: a ``Transport`` that speaks the CLI's stream-json
control protocol (initialize, ``can_use_tool`` control requests, interrupt) and plays a fixed session.

The SDK is real; only the CLI process is replaced. The script is what Claude Code would send: assistant
messages with ``tool_use`` blocks, a ``can_use_tool`` control request before each guarded tool (whose
``control_response`` decides the tool's result), user messages with ``tool_result`` blocks, messages of
a ``Task`` subagent carrying ``parent_tool_use_id``, and the final ``result``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from claude_agent_sdk import Transport

MODEL = "claude-scripted"
SESSION = "scripted-session"


def assistant(*content: dict[str, Any], parent: str | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "model": MODEL, "content": list(content)}
    return {"type": "assistant", "message": message, "parent_tool_use_id": parent, "session_id": SESSION}


def tool_result(
    tool_use_id: str, content: str, *, error: bool = False, parent: str | None = None
) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": error}
    message = {"role": "user", "content": [block]}
    return {"type": "user", "message": message, "parent_tool_use_id": parent, "session_id": SESSION}


def result(*, error: bool = False, text: str = "done") -> dict[str, Any]:
    return {"type": "result", "subtype": "error_during_execution" if error else "success",
            "duration_ms": 1, "duration_api_ms": 1, "is_error": error, "num_turns": 3,
            "session_id": SESSION, "result": text}  # fmt: skip


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(tool_use_id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": input}


QUESTION = {
    "question": "Which format?",
    "header": "Format",
    "multiSelect": False,
    "options": [
        {"label": "Markdown", "description": "in the chat"},
        {"label": "PDF", "description": "print"},
    ],
}


class ScriptedClaude(Transport):
    """Plays one session: a Bash call needing permission, an AskUserQuestion, a Task subagent."""

    def __init__(
        self, *, partial: bool = False, parallel: bool = False, repeat: bool = False, keep_rules: bool = True
    ) -> None:
        self.partial = partial  # also stream the first text as deltas (include_partial_messages)
        self.parallel = parallel  # instead: two guarded tool calls asking at the same time
        self.repeat = repeat  # instead: two Bash calls one after the other (allow always)
        # As Claude Code does: a session rule the SDK's answer added lets the tool run without asking.
        # False: a CLI that asks again anyway (a rule it could not apply).
        self.keep_rules = keep_rules
        self.session_rules: set[str] = set()
        self.out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.responses: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.interrupted = asyncio.Event()
        self.permission_answers: list[dict[str, Any]] = []
        self.ready = False
        self.player: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.ready = True

    def is_ready(self) -> bool:
        return self.ready

    async def end_input(self) -> None:
        return None

    async def close(self) -> None:
        self.ready = False
        if self.player is not None:
            self.player.cancel()
        await self.out.put(None)

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        while (message := await self.out.get()) is not None:
            yield message

    async def write(self, data: str) -> None:
        for line in data.splitlines():
            await self._received(json.loads(line))

    async def _received(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "control_request":  # from the SDK: initialize, interrupt
            request = message["request"]
            if request["subtype"] == "interrupt":
                self.interrupted.set()
            await self.out.put({"type": "control_response", "response": {
                "subtype": "success", "request_id": message["request_id"], "response": {}}})  # fmt: skip
        elif kind == "control_response":  # the SDK's answer to our can_use_tool
            answer = message["response"]
            self.responses[answer["request_id"]].set_result(answer.get("response") or {})
        elif kind == "user" and self.player is None:
            self.player = asyncio.create_task(self.play())

    async def ask_permission(
        self, request_id: str, tool: str, input: dict[str, Any], tool_use_id: str
    ) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.responses[request_id] = future
        request = {"subtype": "can_use_tool", "tool_name": tool, "input": input, "tool_use_id": tool_use_id}
        await self.out.put({"type": "control_request", "request_id": request_id, "request": request})
        interrupted = asyncio.ensure_future(self.interrupted.wait())
        done, _ = await asyncio.wait({future, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        interrupted.cancel()
        if future not in done:
            raise asyncio.CancelledError
        answer = future.result()
        self.permission_answers.append(answer)
        for update in answer.get("updatedPermissions") or []:
            if self.keep_rules and update.get("type") == "addRules" and update.get("behavior") == "allow":
                self.session_rules.update(rule["toolName"] for rule in update.get("rules", []))
        return answer

    async def play(self) -> None:
        try:
            if self.repeat:
                await self._repeated_session()
            else:
                await (self._parallel_session() if self.parallel else self._session())
        except asyncio.CancelledError:
            await self.out.put(result(error=True, text="interrupted"))

    async def _session(self) -> None:
        put = self.out.put
        if self.partial:
            for index, word in enumerate(["Let ", "me ", "run ", "the ", "tests. "]):
                delta = {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": word},
                }
                await put(
                    {"type": "stream_event", "uuid": f"e{index}", "session_id": SESSION, "event": delta}
                )
        await put(assistant(text("Let me run the tests. "), tool_use("t1", "Bash", {"command": "pytest -q"})))
        answer = await self.ask_permission("p1", "Bash", {"command": "pytest -q"}, "t1")
        if answer.get("behavior") == "allow":
            await put(tool_result("t1", "3 failed: test_cards"))
        else:
            await put(tool_result("t1", str(answer.get("message")), error=True))
        await put(assistant(tool_use("t2", "Read", {"file_path": "/nope.py"})))
        await put(tool_result("t2", "File does not exist.", error=True))
        asked = {"questions": [QUESTION]}
        await put(assistant(tool_use("q1", "AskUserQuestion", asked)))
        answer = await self.ask_permission("p2", "AskUserQuestion", asked, "q1")
        chosen = (answer.get("updatedInput") or {}).get("answers") or {}
        await put(
            tool_result("q1", f"User answered: {json.dumps(chosen)}", error=answer.get("behavior") != "allow")
        )
        task = {"description": "Investigate the failures", "subagent_type": "Explore", "prompt": "find why"}
        await put(assistant(tool_use("s1", "Task", task)))
        await put(assistant(text("looking"), parent="s1"))
        await asyncio.sleep(1.5)  # the subagent works; the card lists it meanwhile
        await put(assistant(tool_use("s1-r", "Grep", {"pattern": "card"}), parent="s1"))
        await put(tool_result("s1-r", "3 hits", parent="s1"))
        await asyncio.sleep(1.5)
        await put(tool_result("s1", "The card builder drops the footer."))
        await put(assistant(text("All done.")))
        await put(result())

    async def _repeated_session(self) -> None:
        for index, command in enumerate(["make build", "make test"]):
            tool_id = f"b{index}"
            await self.out.put(assistant(tool_use(tool_id, "Bash", {"command": command})))
            allowed = "Bash" in self.session_rules
            if not allowed:
                answer = await self.ask_permission(f"p-{tool_id}", "Bash", {"command": command}, tool_id)
                allowed = answer.get("behavior") == "allow"
            await self.out.put(
                tool_result(tool_id, f"{command}: ok" if allowed else "denied", error=not allowed)
            )
        await self.out.put(result())

    async def _parallel_session(self) -> None:
        calls = [("w1", "Write", {"file_path": "a.txt", "content": "a"}), ("w2", "Bash", {"command": "make"})]
        await self.out.put(assistant(*(tool_use(tool_id, name, args) for tool_id, name, args in calls)))
        answers = await asyncio.gather(*(self.ask_permission(f"p-{tool_id}", name, args, tool_id)
                                         for tool_id, name, args in calls))  # fmt: skip
        for (tool_id, _, _), answer in zip(calls, answers, strict=True):
            await self.out.put(tool_result(tool_id, "ok", error=answer.get("behavior") != "allow"))
        await self.out.put(result())
