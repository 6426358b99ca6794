"""``feishu-progress smoke`` through a real service (in-process) against the sandbox, as CI runs it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from feishu_progress.app import create_app
from feishu_progress.config import ApiSettings, Settings
from feishu_progress.db.migrate import upgrade
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.smoke import SmokeOptions, run_smoke
from feishu_progress.web.http import serving
from tests import test_doctor
from tests.test_doctor import (
    RESEARCH_ENV,
    _research_file,
    _settings,
)

pytestmark = pytest.mark.slow  # a serve subprocess per test

CHAT, REQUESTER = "oc_smoke", "ou_operator"
research = test_doctor.research  # the second app's sandbox, shared with the doctor tests


@pytest.fixture
async def served(sandbox: RunningSandbox, tmp_path: Path) -> AsyncIterator[tuple[Settings, str]]:
    settings = _settings(sandbox, tmp_path)
    await upgrade(settings.database_url)
    async with serving(create_app(settings, registry=CollectorRegistry())) as url:
        yield settings, url


async def test_auto_answer_runs_every_step_and_leaves_a_finished_card(
    sandbox: RunningSandbox, served: tuple[Settings, str]
) -> None:
    settings, url = served
    lines: list[str] = []
    options = SmokeOptions(chat_id=CHAT, requester_open_id=REQUESTER, base_url=url, auto_answer=True)
    assert await run_smoke(settings, options, lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)
    for step in (
        "1. send a card",
        "2. stream text",
        "3. a subagent",
        "4. streaming off",
        "5. wait",
        "6. finish",
    ):
        assert step in text, text
    assert "the click arrived: cancel" in text and lines[-1] == "smoke: passed"
    (message,) = sandbox.state.messages.values()
    assert message.chat_id == CHAT
    assert "冒烟测试完成" in str(message.card)  # the final card reached the chat
    assert message.card_id is not None  # the text streamed through CardKit


async def test_a_refusal_is_printed_with_its_fix(
    sandbox: RunningSandbox, served: tuple[Settings, str]
) -> None:
    settings, url = served
    wrong = settings.model_copy(update={"api": ApiSettings(token="not-the-token")})
    lines: list[str] = []
    options = SmokeOptions(chat_id=CHAT, requester_open_id=REQUESTER, base_url=url, auto_answer=True)
    assert await run_smoke(wrong, options, lines.append) == 1
    assert "1. send a card" in lines[0] and "FAILED" in lines[0] and "401" in lines[0]
    assert lines[-1] == "smoke: FAILED"


async def test_no_click_in_time_fails_the_wait_step(served: tuple[Settings, str]) -> None:
    settings, url = served
    lines: list[str] = []
    options = SmokeOptions(chat_id=CHAT, requester_open_id=REQUESTER, base_url=url, wait_minutes=0.02)
    assert await run_smoke(settings, options, lines.append) == 1
    text = "\n".join(lines)
    assert "取消任务" in text  # it said what to click
    assert "5. wait for a click or an answer" in text and "no click within" in text


async def test_app_sends_the_card_from_that_app_and_clicks_on_its_route(
    sandbox: RunningSandbox, research: RunningSandbox, tmp_path: Path
) -> None:
    """Two apps on two sandboxes: ``--app research`` lands in research's sandbox; the default in the other."""
    settings = _settings(sandbox, tmp_path, apps_file=str(_research_file(tmp_path, research.base_url)))
    await upgrade(settings.database_url)
    async with serving(create_app(settings, registry=CollectorRegistry())) as url:
        lines: list[str] = []
        options = SmokeOptions(CHAT, REQUESTER, url, auto_answer=True, app="research")
        assert await run_smoke(settings, options, lines.append, RESEARCH_ENV) == 0, "\n".join(lines)
        assert "(app research)" in lines[0] and "the click arrived: cancel" in "\n".join(lines)
        (message,) = research.state.messages.values()
        assert "冒烟测试完成" in str(message.card) and sandbox.state.messages == {}
        default = SmokeOptions(CHAT, REQUESTER, url, auto_answer=True)
        assert await run_smoke(settings, default, lines.append, RESEARCH_ENV) == 0, "\n".join(lines)
        (first,) = sandbox.state.messages.values()
        assert "冒烟测试完成" in str(first.card) and len(research.state.messages) == 1
        unknown = SmokeOptions(CHAT, REQUESTER, url, auto_answer=True, app="sales")
        lines.clear()
        assert await run_smoke(settings, unknown, lines.append, RESEARCH_ENV) == 1
    assert lines == [
        "smoke: FAILED: no app 'sales' to click as: the apps are default, research (FP_APPS_FILE)"
    ]
