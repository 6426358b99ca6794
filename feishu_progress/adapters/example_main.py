"""The one ``main()`` of the agent examples (examples/*.py): each example is its SDK wiring only.

    sys.exit(run_example(__doc__, run, title="OpenAI Agents example", key_env="OPENAI_API_KEY"))

``run(card, offline)`` runs the agent on the card (a scripted model when ``offline``) and returns what
to print as its result. Around it: the service from ``FEISHU_PROGRESS_URL`` (default
http://127.0.0.1:8000) and ``FEISHU_PROGRESS_TOKEN`` (default FP_API__TOKEN, else none); ``--offline``
(also when ``key_env`` is unset: no real model without its key); ``--auto-answer`` approves and answers
through the sandbox's signed-click endpoint (``sandbox_user``); ``--answer-timeout`` seconds before a
request is denied. The exit code is 0 when the task ended COMPLETED.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable, Sequence

import aiohttp

from feishu_progress.adapters.card_session import DEFAULT_APPROVAL_TIMEOUT_SECONDS, CardSession, open_card
from feishu_progress.adapters.sandbox_user import SandboxUser
from feishu_progress.client import FeishuProgressClient

CHAT, REQUESTER = "oc_example_chat", "ou_example_user"
DEFAULT_URL = "http://127.0.0.1:8000"
CLICKS_DONE_SECONDS = 30.0  # the auto-answerer stops once the card shows the end
AgentRun = Callable[[CardSession, bool], Awaitable[object]]


def run_example(
    doc: str, run: AgentRun, *, title: str, key_env: str, argv: Sequence[str] | None = None
) -> int:
    """Parse the flags, run the agent on a new card, print how it ended; the process's exit code."""
    args = parse_args(doc, argv)
    offline = args.offline or not os.environ.get(key_env)
    return asyncio.run(_main(run, title, offline=offline, auto_answer=args.auto_answer,
                             answer_timeout=args.answer_timeout))  # fmt: skip


def parse_args(doc: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    parser.add_argument("--offline", action="store_true", help="a scripted model: no network, no key")
    parser.add_argument(
        "--auto-answer", action="store_true", help="approve and answer through the sandbox's click endpoint"
    )
    parser.add_argument("--answer-timeout", type=float, default=DEFAULT_APPROVAL_TIMEOUT_SECONDS,
                        help="seconds before an approval or a question is denied")  # fmt: skip
    return parser.parse_args(argv)


async def _main(run: AgentRun, title: str, *, offline: bool, auto_answer: bool, answer_timeout: float) -> int:
    base_url = os.environ.get("FEISHU_PROGRESS_URL", DEFAULT_URL).rstrip("/")
    token = os.environ.get("FEISHU_PROGRESS_TOKEN") or os.environ.get("FP_API__TOKEN") or None
    async with aiohttp.ClientSession() as http, FeishuProgressClient(base_url, token) as fp:
        clicking: asyncio.Task[None] | None = None
        try:
            async with open_card(fp, receive_id=CHAT, requester_open_id=REQUESTER, title=title,
                                 idempotency_key=f"example-{uuid.uuid4()}",
                                 approval_timeout=answer_timeout) as card:  # fmt: skip
                _say(f"task {card.session_id}: card message {card.message_id}")
                if auto_answer and card.message_id:
                    user = SandboxUser(http, base_url, token)
                    clicking = asyncio.create_task(user.auto_answer(card.message_id))
                _say(f"result: {await run(card, offline)}")
        finally:
            if clicking is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(clicking, CLICKS_DONE_SECONDS)
        view = await fp.get_task(card.session_id)
    _say(f"task {view.session_id} finished: {view.status.value}")
    return 0 if view.status.value == "COMPLETED" else 1


def _say(line: str) -> None:
    print(line, flush=True)  # noqa: T201 -- an example speaks on stdout
