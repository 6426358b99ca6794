"""A minimal agent runtime on feishu-progress: streams text, calls tools, asks, waits for the answer.

It plays a scripted agent (no model, no real tools) through the runtime API with the Python client
(``feishu_progress.client``) and ends with a finished card:

1. creates a task (its first card appears in the chat);
2. streams its thinking as ``content_delta`` tokens (the client coalesces them into few requests);
3. runs two fake tools (a search, a shell command) and one that "generates" an image, handed over
   with ``upload_image`` and named in the tool's result;
4. asks the user a question (the card shows a form and waits), then waits for the answer through the
   actions long-poll — a cancel click ends the task instead;
5. finishes the task (COMPLETED) and prints the card's final state.

Run it against the service in sandbox mode (no Feishu account; cards go to the in-process sandbox):

    feishu-progress serve                                # http://127.0.0.1:8000
    python examples/minimal_runtime.py --auto-answer

Without ``--auto-answer`` it waits for you: open http://127.0.0.1:8000/sandbox/ and answer on the card.
``--auto-answer`` answers as the task's requester would, through the sandbox preview's click endpoint
(``POST /sandbox/api/click``: a real signed Feishu callback), picking each question's first option —
only a sandbox has that endpoint. Configuration comes from the environment:

    FEISHU_PROGRESS_URL    the service (default http://127.0.0.1:8000)
    FEISHU_PROGRESS_TOKEN  its FP_API__TOKEN (default: FP_API__TOKEN, else none — sandbox mode on loopback)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import sys
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from feishu_progress.adapters.sandbox_user import first_choices
from feishu_progress.client import EventStream, FeishuProgressClient
from feishu_progress.runtime.responses import AnswersAction, CancelAction

CHAT = "oc_example_chat"
REQUESTER = "ou_example_user"
TOKEN_DELAY_SECONDS = 0.02  # a model streaming ~50 tokens a second
QUESTION = {
    "question": "Which format should the report use?",
    "options": [
        {"label": "Markdown", "description": "readable in the chat"},
        {"label": "PDF", "description": "for printing"},
    ],
}


def say(line: str) -> None:
    print(line, flush=True)


def tiny_png() -> bytes:
    """A 4x4 blue PNG, made by hand (the "generated" image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x33\x99\xff" * 4 for _ in range(4))
    header = struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def stream_text(events: EventStream, text: str) -> None:
    """Send ``text`` word by word, as a model streams tokens."""
    for word in text.split(" "):
        await events.add({"type": "content_delta", "text": word + " "})
        await asyncio.sleep(TOKEN_DELAY_SECONDS)


async def run_tool(
    events: EventStream, call_id: str, name: str, args: Mapping[str, Any], result: Any
) -> None:
    await events.add({"type": "tool_started", "call_id": call_id, "name": name, "args": dict(args)})
    await asyncio.sleep(0.3)  # the tool "works"
    await events.add({"type": "tool_finished", "call_id": call_id, "result": result})


async def work(fp: FeishuProgressClient, session_id: int) -> None:
    """Round 1: think aloud, search, run a command, make an image."""
    async with fp.event_stream(session_id) as events:
        await events.add({"type": "status", "status": "RUNNING", "round": 1})
        await stream_text(events, "Let me look at how the progress card is updated, then check the tests.")
        await run_tool(
            events,
            "c1",
            "web_search",
            {"query": "feishu card update rate limit"},
            {"results": [{"title": "Update a message card", "url": "https://open.feishu.cn/document"}]},
        )
        await run_tool(
            events, "c2", "shell", {"command": "pytest -q"}, {"exit_code": 0, "stdout": "42 passed"}
        )
        image = await fp.upload_image(session_id, tiny_png(), filename="chart.png")
        say(f"uploaded an image: {image.image_ref} ({image.bytes} bytes)")
        picture = {"image_url": image.image_ref, "size_bytes": image.bytes, "mime": image.mime}
        result = {"images": [picture], "model": "example", "prompt": "a chart of card updates"}
        await run_tool(events, "c3", "generate_image", {"prompt": "a chart of card updates"}, result)
        await stream_text(events, "The tests pass. One question before I write the report.")


@dataclass
class Runtime:
    """The runtime's connection to the service, and how it gets its answers."""

    fp: FeishuProgressClient
    base_url: str
    token: str | None
    auto: bool
    answer_timeout: float

    async def ask(self, session_id: int, ask_id: str) -> AnswersAction | None:
        """Ask the question and wait for the answer (None: the user cancelled the task instead)."""
        await self.fp.post_events(session_id, [{"type": "ask", "ask_id": ask_id, "questions": [QUESTION]}])
        if self.auto:
            await self.auto_answer(session_id)
        else:
            say(f"waiting for your answer on the card: {self.base_url}/sandbox/ (or in Feishu)")
        async with asyncio.timeout(self.answer_timeout):
            return await self.wait_for_answer(session_id, ask_id)

    async def auto_answer(self, session_id: int) -> None:
        """Answer the card's question through the sandbox preview, as the task's requester."""
        view = await self.fp.get_task(session_id)
        choices = first_choices(view.card)  # the same user the agent adapters' examples click as
        if choices is None:
            raise RuntimeError("the card shows no form to answer")
        form, submit = choices
        click = {"message_id": view.message_id, "form_value": form, **submit}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.post(f"{self.base_url}/sandbox/api/click", json=click) as response,
        ):
            answer = await response.json()
        if response.status != 200 or answer.get("status") != 200:
            raise RuntimeError(f"the sandbox did not take the click: {response.status} {answer}")
        say(f"auto-answer clicked: {answer['answer'].get('toast', {}).get('content')}")

    async def wait_for_answer(self, session_id: int, ask_id: str) -> AnswersAction | None:
        """The answers to ``ask_id`` from the actions long-poll; None when the user cancelled instead."""
        async for action in self.fp.actions(session_id):
            say(f"user action #{action.cursor}: {action.kind} by {action.operator_open_id}")
            if isinstance(action, CancelAction):
                return None
            if isinstance(action, AnswersAction) and action.payload.ask_id == ask_id:
                return action
        raise AssertionError("the actions never end")


async def finish(fp: FeishuProgressClient, session_id: int, answered: AnswersAction | None) -> None:
    """Round 2: use the answer, then end the task (or end it cancelled)."""
    if answered is None:
        cancelled = {"type": "finished", "status": "CANCELLED", "content": "Cancelled as you asked."}
        await fp.post_events(session_id, [cancelled])
        return
    chosen = ", ".join(answered.payload.answers[0].selected_labels) or "Markdown"
    async with fp.event_stream(session_id) as events:
        await events.add({"type": "status", "status": "RUNNING", "round": 2})
        await run_tool(
            events,
            "c4",
            "ask_user_questions",
            {"questions": [QUESTION]},
            {"answers": [{"question": QUESTION["question"], "selectedLabels": [chosen]}]},
        )
        await stream_text(events, f"Writing the report as {chosen}.")
        report = f"Done: the card's updates stay within Feishu's limits; the report is in {chosen}."
        await events.add({"type": "finished", "status": "COMPLETED", "content": report})


async def main(args: argparse.Namespace) -> int:
    base_url = os.environ.get("FEISHU_PROGRESS_URL", "http://127.0.0.1:8000").rstrip("/")
    token = os.environ.get("FEISHU_PROGRESS_TOKEN") or os.environ.get("FP_API__TOKEN") or None
    async with FeishuProgressClient(base_url, token) as fp:
        runtime = Runtime(fp, base_url, token, args.auto_answer, args.answer_timeout)
        # The key makes the create safe to retry (the client retries a 503): one run, one task.
        task = await fp.create_task(
            receive_id=CHAT,
            receive_id_type="chat_id",
            requester_open_id=REQUESTER,
            title="Minimal runtime example",
            idempotency_key=f"minimal-runtime-{uuid.uuid4()}",
        )
        say(f"task {task.session_id}: card message {task.message_id}")
        await work(fp, task.session_id)
        answered = await runtime.ask(task.session_id, "ask-1")
        await finish(fp, task.session_id, answered)
        view = await fp.get_task(task.session_id)
    say(f"task {view.session_id} finished: {view.status.value}")
    return 0 if view.status.value in ("COMPLETED", "CANCELLED") else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--auto-answer",
        action="store_true",
        help="answer the question through the sandbox preview's click endpoint",
    )
    parser.add_argument("--answer-timeout", type=float, default=600.0, help="seconds to wait for the answer")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
