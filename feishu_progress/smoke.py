"""``feishu-progress smoke --chat <chat_id> [--app <name>]``: a five-step live run through ``serve``.

It is the runtime's own path: the runtime API of the running service (FP_API__TOKEN), which writes the
card to Feishu and receives the click. Steps: send a card; stream text; a subagent and a failing tool;
streaming off and a question; wait for the operator's click or answer (``--auto-answer``: click as
Feishu would, signed with the app's callback keys on its route; for the sandbox and CI); finish. ``--app``
names the app of FP_APPS_FILE that sends the card (default: the default app). Each step prints the
runtime call, its answer and the time, then whether the card still updates (a Feishu refusal is named
with its meaning and fix).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from feishu_progress.apps import default_app_name
from feishu_progress.apps_file import app_specs
from feishu_progress.client import ApiError, FeishuProgressClient
from feishu_progress.config import FeishuSettings, Settings
from feishu_progress.doctor.meanings import fix_for, meaning
from feishu_progress.errors import ConfigError
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.web.callbacks import callback_path

Print = Callable[[str], None]
POLL_SECONDS = 20.0  # one long-poll; the wait step asks again until its deadline
SETTLE_SECONDS = 1.5  # the service writes cards on its own pace: give it time before reading the card
_CODE = re.compile(r"\b(\d{5,8})\b")

STREAMED = "冒烟测试:这段文字应当在卡片里逐字出现(CardKit 打字机),或整段刷新(PATCH)。"
TOOL_EVENTS: tuple[dict[str, Any], ...] = (
    {"type": "tool_started", "call_id": "s1", "name": "spawn_subagent", "args": {"agent_type": "explorer"}},
    {"type": "tool_finished", "call_id": "s1", "result": {"task_id": 1, "status": "RUNNING"}},
    {
        "type": "subagent_started",
        "task_id": 1,
        "child_session_id": 1,
        "agent_type": "explorer",
        "title": "冒烟测试子代理",
        "invocation_type": "BACKGROUND",
    },
    {"type": "tool_started", "call_id": "s2", "name": "shell", "args": {"command": "false"}},
    {"type": "tool_finished", "call_id": "s2", "result": {"error": "exit code 1 (a deliberate failure)"}},
)
QUESTION = {
    "type": "ask",
    "ask_id": "smoke",
    "questions": [{"question": "冒烟测试:卡片看起来正常吗?", "options": ["正常", "有问题"]}],
}


@dataclass(slots=True)
class SmokeOptions:
    chat_id: str
    requester_open_id: str
    base_url: str
    wait_minutes: float = 5.0
    auto_answer: bool = False
    app: str | None = None  # FP_APPS_FILE's app that sends the card; None: the default app


@dataclass(frozen=True, slots=True)
class ClickTarget:
    """Where ``--auto-answer`` clicks: the app's callback route on the service, with that app's keys."""

    url: str
    keys: FeishuSettings


def click_target(settings: Settings, options: SmokeOptions, environ: Mapping[str, str]) -> ClickTarget:
    """The app's route and keys (ConfigError naming the apps there are, for an app not configured)."""
    specs = app_specs(settings, environ)
    names = [spec.name for spec in specs]
    name = options.app if options.app is not None else default_app_name(names)
    for spec in specs:
        if spec.name == name:
            return ClickTarget(options.base_url + callback_path(spec.name), spec.feishu)
    raise ConfigError(f"no app {options.app!r} to click as: the apps are {', '.join(names)} (FP_APPS_FILE)")


class Smoke:
    """The steps, and their printing."""

    def __init__(
        self, options: SmokeOptions, fp: FeishuProgressClient, out: Print, clicks: ClickTarget | None
    ) -> None:
        self.options, self.fp, self.out, self.clicks = options, fp, out, clicks
        self.session_id = 0
        self.message_id = ""
        self.failed = False

    async def step(self, number: int, title: str, api: str, action: Callable[[], Awaitable[str]]) -> bool:
        """Run one step; print the call, answer and time, then the card's delivery state."""
        started = time.perf_counter()
        try:
            answer = await action()
        except ApiError as exc:
            self._failure(number, title, api, f"{exc.status} {exc}", started)
            return False
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._failure(number, title, api, str(exc) or f"service not reachable: {exc!r}", started)
            return False
        self.out(f"{number}. {title:<32} {api} → {answer} ({_ms(started)} ms)")
        return await self._card_still_updates()

    def _failure(self, number: int, title: str, api: str, text: str, started: float) -> None:
        self.failed = True
        self.out(f"{number}. {title:<32} {api} → FAILED ({_ms(started)} ms): {text}")
        code = _code_in(text)
        if code is not None:
            self.out(f"   meaning: {meaning(code, text)}\n   fix: {fix_for(code, text)}")

    async def _card_still_updates(self) -> bool:
        if not self.session_id:
            return True
        await asyncio.sleep(SETTLE_SECONDS)
        view = await self.fp.get_task(self.session_id)
        if view.stop_reason is None:
            return True
        self.failed = True
        self.out(f"   the card stopped updating: {view.stop_reason}")
        code = _code_in(view.stop_reason)
        if code is not None:
            self.out(
                f"   meaning: {meaning(code, view.stop_reason)}\n   fix: {fix_for(code, view.stop_reason)}"
            )
        return False

    async def create(self) -> str:
        created = await self.fp.create_task(
            receive_id=self.options.chat_id,
            receive_id_type="chat_id",
            requester_open_id=self.options.requester_open_id,
            title="feishu-progress smoke",
            app=self.options.app,
        )
        self.session_id, self.message_id = created.session_id, created.message_id
        sender = f" (app {self.options.app})" if self.options.app else ""
        return f"201, message {created.message_id}{sender}"

    async def stream(self) -> str:
        await self.fp.post_events(self.session_id, [{"type": "status", "status": "RUNNING", "round": 1}])
        for start in range(0, len(STREAMED), 4):
            await self.fp.post_events(
                self.session_id, [{"type": "content_delta", "text": STREAMED[start : start + 4]}]
            )
            await asyncio.sleep(0.1)
        return f"200 × {len(range(0, len(STREAMED), 4)) + 1}"

    async def tools(self) -> str:
        return f"200, {await self.fp.post_events(self.session_id, TOOL_EVENTS)} events"

    async def question(self) -> str:
        return f"200, {await self.fp.post_events(self.session_id, [QUESTION])} event (WAITING)"

    async def wait_for_click(self) -> str:
        if self.clicks is not None:
            await self._click_cancel(self.clicks)
        else:
            self.out(
                f"   → in the chat, on the card 'feishu-progress smoke': answer the question (提交) or click "
                f"取消任务 — waiting up to {self.options.wait_minutes:g} min"
            )
        deadline = time.monotonic() + self.options.wait_minutes * 60
        cursor = 0
        while time.monotonic() < deadline:
            remaining = max(0.0, deadline - time.monotonic())
            page = await self.fp.poll_actions(
                self.session_id, after=cursor, wait=min(POLL_SECONDS, remaining)
            )
            cursor = page.cursor
            if page.actions:
                return f"200, the click arrived: {page.actions[-1].kind}"
        raise TimeoutError(f"no click within {self.options.wait_minutes:g} min: check callbacks with doctor")

    async def finish(self) -> str:
        final = {"type": "finished", "status": "COMPLETED", "content": "冒烟测试完成。"}
        await self.fp.post_events(self.session_id, [final])
        return "200, final card"

    async def _click_cancel(self, clicks: ClickTarget) -> None:
        feishu = clicks.keys
        token = feishu.verification_token.get_secret_value() if feishu.verification_token else ""
        key = feishu.encrypt_key.get_secret_value() if feishu.encrypt_key else None
        payload = card_action_payload(
            open_id=self.options.requester_open_id,
            message_id=self.message_id,
            chat_id=self.options.chat_id,
            value={"v": 1, "action": "cancel", "session_id": self.session_id},
            verification_token=token,
            now=time.time(),
        )
        body, headers = signed_request(payload, encrypt_key=key, now=time.time())
        async with (
            aiohttp.ClientSession() as http,
            http.post(clicks.url, data=body, headers=headers) as response,
        ):
            self.out(f"   auto-answer: clicked 取消任务 as Feishu would → HTTP {response.status}")


async def run_smoke(
    settings: Settings, options: SmokeOptions, out: Print, environ: Mapping[str, str] | None = None
) -> int:
    """The five steps; 0 when every step passed and the card kept updating. ``environ``: where the apps
    file's ``*_env`` keys are read (os.environ when None), for ``--auto-answer``'s keys."""
    try:
        environ = os.environ if environ is None else environ
        clicks = click_target(settings, options, environ) if options.auto_answer else None
    except ConfigError as exc:
        out(f"smoke: FAILED: {exc}")
        return 1
    token = settings.api.token.get_secret_value() if settings.api.token else None
    async with FeishuProgressClient(options.base_url, token) as fp:
        smoke = Smoke(options, fp, out, clicks)
        steps: tuple[tuple[str, str, Callable[[], Awaitable[str]]], ...] = (
            ("send a card", "POST /v1/tasks", smoke.create),
            ("stream text", "POST /v1/tasks/{id}/events", smoke.stream),
            ("a subagent and a failing tool", "POST /v1/tasks/{id}/events", smoke.tools),
            ("streaming off, a question", "POST /v1/tasks/{id}/events", smoke.question),
            ("wait for a click or an answer", "GET /v1/tasks/{id}/actions", smoke.wait_for_click),
        )
        for number, (title, api, action) in enumerate(steps, start=1):
            if not await smoke.step(number, title, api, action):
                break
        else:
            await smoke.step(6, "finish", "POST /v1/tasks/{id}/events", smoke.finish)
    out("smoke: " + ("FAILED" if smoke.failed else "passed"))
    return 1 if smoke.failed else 0


def _code_in(text: str) -> int | None:
    found = _CODE.search(text)
    return int(found.group(1)) if found else None


def _ms(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


def default_base_url(settings: Settings) -> str:
    """FP_PUBLIC_URL, else this host's listener."""
    return settings.public_url or f"http://127.0.0.1:{settings.http.port}"


__all__ = ["SmokeOptions", "default_base_url", "run_smoke"]
