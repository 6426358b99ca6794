"""The examples against ``feishu-progress serve`` in sandbox mode, both as subprocesses.

The service runs as a user runs it (a process, a free port, a temporary working directory, no FP_
setting but the ones given here); the example runs as ``python examples/minimal_runtime.py
--auto-answer`` and must exit 0 with the sandbox holding the task's card in its final, COMPLETED state.
Both processes are always stopped. These wait on real time (processes, sockets): few and bounded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.rigs import answers_200, eventually

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "minimal_runtime.py"
# The agent SDK examples (feishu_progress/adapters), each with its scripted model: no network, no key.
AGENT_EXAMPLES = ["openai_agents.py", "langgraph_agent.py", "claude_agent_sdk.py"]
START_SECONDS = 60
RUN_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(**settings: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FP_", "FEISHU_PROGRESS_"))}
    env["PYTHONPATH"] = str(REPO)  # this checkout, not whichever copy is installed
    env.update(settings)
    return env


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), 30)
    except TimeoutError:
        process.kill()
        await process.wait()


async def _until_serving(http: aiohttp.ClientSession, process: asyncio.subprocess.Process, url: str) -> None:
    async def serving() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"serve exited with {process.returncode}")
        return await answers_200(http, f"{url}/v1/openapi.json")

    await eventually(serving, timeout=START_SECONDS, interval=0.1, what="serve to answer")


async def _final_card(http: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The sandbox's card once its last PATCH arrived (the final state goes out within the pacing)."""

    async def card() -> dict[str, Any]:
        async with http.get(f"{url}/sandbox/api/messages", headers=headers) as response:
            messages = (await response.json())["messages"]
        assert len(messages) == 1, messages
        shown: dict[str, Any] = messages[0]["card"]
        return shown

    final: dict[str, Any] = await eventually(
        card,
        until=lambda shown: shown["header"]["template"] == "green",
        timeout=10,
        interval=0.1,
        what="the card's final state",
    )
    return final


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.parametrize("token", [None, "example-token"], ids=["no-token", "token"])
async def test_the_minimal_runtime_runs_to_a_finished_card(
    tmp_path: Path, http: aiohttp.ClientSession, token: str | None
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    auth = {"FP_API__TOKEN": token} if token else {}
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        env=_env(FP_HTTP__HOST="127.0.0.1", FP_HTTP__PORT=str(port), FP_ADMIN__PORT="0",
                 FP_LOG_LEVEL="WARNING", **auth),
        cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    example: asyncio.subprocess.Process | None = None
    try:
        await _until_serving(http, server, url)
        client_auth = {"FEISHU_PROGRESS_TOKEN": token} if token else {}
        example = await asyncio.create_subprocess_exec(
            sys.executable, str(EXAMPLE), "--auto-answer", "--answer-timeout", "30",
            env=_env(FEISHU_PROGRESS_URL=url, **client_auth),
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output = (await asyncio.wait_for(example.communicate(), RUN_SECONDS))[0].decode()
        assert example.returncode == 0, output
        assert "auto-answer clicked: 回答已提交" in output and "finished: COMPLETED" in output, output
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        card = await _final_card(http, url, headers)
        assert card["header"]["text_tag_list"][0]["text"]["content"] == "已完成"
    finally:
        if example is not None:
            await _stop(example)
        await _stop(server)
    errors = (await server.stderr.read()).decode() if server.stderr else ""
    assert "Traceback" not in errors, errors[-3000:]


@pytest.mark.parametrize("name", AGENT_EXAMPLES)
async def test_an_agent_sdk_example_runs_offline_to_a_finished_card(
    tmp_path: Path, http: aiohttp.ClientSession, name: str
) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    token = "example-token"
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        env=_env(FP_HTTP__HOST="127.0.0.1", FP_HTTP__PORT=str(port), FP_ADMIN__PORT="0",
                 FP_LOG_LEVEL="WARNING", FP_API__TOKEN=token),
        cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    example: asyncio.subprocess.Process | None = None
    try:
        await _until_serving(http, server, url)
        # No API key reaches the example: a run that ignored --offline could not call a model either.
        settings = _env(FEISHU_PROGRESS_URL=url, FEISHU_PROGRESS_TOKEN=token)
        env = {
            key: value
            for key, value in settings.items()
            if key not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY")
        }
        script = str(REPO / "examples" / name)
        example = await asyncio.create_subprocess_exec(
            sys.executable, script, "--offline", "--auto-answer", "--answer-timeout", "30",
            env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output = (await asyncio.wait_for(example.communicate(), RUN_SECONDS))[0].decode()
        assert example.returncode == 0, output
        assert "finished: COMPLETED" in output, output
        card = await _final_card(http, url, {"Authorization": f"Bearer {token}"})
        assert card["header"]["text_tag_list"][0]["text"]["content"] == "已完成"
    finally:
        if example is not None:
            await _stop(example)
        await _stop(server)
    errors = (await server.stderr.read()).decode() if server.stderr else ""
    assert "Traceback" not in errors, errors[-3000:]
