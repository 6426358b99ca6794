"""An OpenAI Agents SDK agent on a live card: its text, its tools, and a tool that asks the card first.

    pip install "feishu-progress[openai-agents]"
    feishu-progress serve                                   # sandbox mode: http://127.0.0.1:8000
    python examples/openai_agents.py --offline --auto-answer

With ``OPENAI_API_KEY`` set (and no ``--offline``) a real model runs the agent; ``--offline`` plays a
scripted model (the SDK's own ``agents.testing.ScriptedModel``) instead. The ``deploy`` tool has
``needs_approval``: the card shows 同意 / 拒绝 and the run waits. ``--auto-answer`` approves through the
sandbox's signed-click endpoint as the requester would (only a sandbox has it); without it, click on
http://127.0.0.1:8000/sandbox/. Configuration: ``FEISHU_PROGRESS_URL`` (default http://127.0.0.1:8000)
and ``FEISHU_PROGRESS_TOKEN`` (default FP_API__TOKEN, else none).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

import aiohttp
from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from feishu_progress.adapters import open_card
from feishu_progress.adapters.openai_agents import run_on_card
from feishu_progress.adapters.sandbox_user import SandboxUser
from feishu_progress.client import FeishuProgressClient

CHAT, REQUESTER = "oc_example_chat", "ou_example_user"


@function_tool
def run_tests(path: str) -> str:
    """Run the test suite under ``path``."""
    return f"42 passed in {path}"


@function_tool(needs_approval=True)
def deploy(env: str) -> str:
    """Deploy the service to ``env`` (asks the user first)."""
    return f"deployed to {env}"


def scripted_model() -> ScriptedModel:
    return ScriptedModel([
        [assistant_message("Running the tests before deploying. "),
         function_call("run_tests", {"path": "tests/"}, call_id="call-1")],
        [function_call("deploy", {"env": "staging"}, call_id="call-2")],
        [assistant_message("Tests pass and staging is deployed.")],
    ])  # fmt: skip


async def main(args: argparse.Namespace) -> int:
    base_url = os.environ.get("FEISHU_PROGRESS_URL", "http://127.0.0.1:8000").rstrip("/")
    token = os.environ.get("FEISHU_PROGRESS_TOKEN") or os.environ.get("FP_API__TOKEN") or None
    offline = args.offline or not os.environ.get("OPENAI_API_KEY")
    if offline:
        set_tracing_disabled(True)  # nothing leaves the machine
    model = scripted_model() if offline else "gpt-4.1-mini"
    instructions = "Run the tests, then deploy to staging."
    agent = Agent(name="Release", instructions=instructions, tools=[run_tests, deploy], model=model)
    async with aiohttp.ClientSession() as http:
        user = SandboxUser(http, base_url, token)
        clicking: asyncio.Task[None] | None = None
        async with (
            FeishuProgressClient(base_url, token) as fp,
            open_card(fp, receive_id=CHAT, requester_open_id=REQUESTER, title="OpenAI Agents example",
                      idempotency_key=f"oa-{uuid.uuid4()}", approval_timeout=args.answer_timeout) as card,
        ):  # fmt: skip
            print(f"task {card.session_id}: card message {card.message_id}", flush=True)
            if args.auto_answer and card.message_id:
                clicking = asyncio.create_task(user.auto_answer(card.message_id))
            result = await run_on_card(card, agent, "Ship it to staging.")
            print(f"final output: {result.final_output}", flush=True)
        if clicking is not None:  # it stops once the card shows the task ended
            await asyncio.wait_for(clicking, 30)
    async with FeishuProgressClient(base_url, token) as fp:
        view = await fp.get_task(card.session_id)
    print(f"task {view.session_id} finished: {view.status.value}", flush=True)
    return 0 if view.status.value == "COMPLETED" else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true", help="a scripted model instead of OpenAI's")
    parser.add_argument(
        "--auto-answer", action="store_true", help="approve through the sandbox's click endpoint"
    )
    parser.add_argument(
        "--answer-timeout", type=float, default=600.0, help="seconds before an approval is denied"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
