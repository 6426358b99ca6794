"""An OpenAI Agents SDK agent on a live card: its text, its tools, and a tool that asks the card first.

    pip install "feishu-progress[openai-agents]"
    feishu-progress serve                                   # sandbox mode: http://127.0.0.1:8000
    python examples/openai_agents.py --offline --auto-answer

With ``OPENAI_API_KEY`` set (and no ``--offline``) a real model runs the agent; ``--offline`` plays a
scripted model (the SDK's own ``agents.testing.ScriptedModel``) instead. The ``deploy`` tool has
``needs_approval``: the card shows 同意 / 始终允许(本任务) / 拒绝 and the run waits. ``--auto-answer``
approves through the sandbox's signed-click endpoint as the requester would (only a sandbox has it);
without it, click on http://127.0.0.1:8000/sandbox/. Configuration: ``FEISHU_PROGRESS_URL`` (default
http://127.0.0.1:8000) and ``FEISHU_PROGRESS_TOKEN`` (default FP_API__TOKEN, else none).
"""

from __future__ import annotations

import sys

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from feishu_progress.adapters import CardSession
from feishu_progress.adapters.example_main import run_example
from feishu_progress.adapters.openai_agents import run_on_card


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


async def run(card: CardSession, offline: bool) -> object:
    if offline:
        set_tracing_disabled(True)  # nothing leaves the machine
    model = scripted_model() if offline else "gpt-4.1-mini"
    instructions = "Run the tests, then deploy to staging."
    agent = Agent(name="Release", instructions=instructions, tools=[run_tests, deploy], model=model)
    result = await run_on_card(card, agent, "Ship it to staging.")
    return result.final_output


if __name__ == "__main__":
    sys.exit(run_example(__doc__ or "", run, title="OpenAI Agents example", key_env="OPENAI_API_KEY"))
