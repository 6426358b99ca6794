"""``feishu-progress demo``: a scripted task against the embedded sandbox, printed as the card evolves.

Everything is real but Feishu: the service runs with SQLite, talks HTTP to an in-process sandbox that
enforces Feishu's limits, and the script drives it the way an agent runtime and a user would — events
through the runtime API (with the Python client, ``feishu_progress.client``), clicks as encrypted, signed
``card.action.trigger`` callbacks.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import tempfile
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.cards.plaintext import card_as_text
from feishu_progress.cards.validate import card_bytes, element_count
from feishu_progress.client import FeishuProgressClient
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CardSettings,
    FeishuSettings,
    HttpSettings,
    ImagesSettings,
    Settings,
)
from feishu_progress.runtime.responses import Answer, AnswersAction, UserAction
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.services import Services
from feishu_progress.web.http import serving

APP_ID = "cli_demo"
APP_SECRET = "demo-app-secret"
ENCRYPT_KEY = "demo-encrypt-key"
VERIFICATION_TOKEN = "demo-verification-token"
API_TOKEN = "demo-api-token"
REQUESTER = "ou_alice"
BYSTANDER = "ou_bob"
CHAT = "oc_demo_chat"
SETTLE_SECONDS = 0.6  # > the 250 ms pacing: the newest state has reached the sandbox

Print = Callable[[str], None]


@dataclass
class DemoResult:
    session_id: int
    message_id: str
    events: int
    patches: int
    cardkit: dict[str, int]  # the sandbox's CardKit counters: entities, full updates, streamed texts...
    responses: dict[int, int]
    final_status: str
    seconds: float
    metrics: list[str]
    largest_card_bytes: int
    largest_card_elements: int


Hold = Callable[[DemoResult, str], Awaitable[None]]


def tiny_png(width: int = 4, height: int = 4) -> bytes:
    """A valid PNG made by hand (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x33\x99\xff" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def demo_settings(sandbox: RunningSandbox, workdir: Path) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{workdir / 'demo.db'}",
        feishu=FeishuSettings(
            base_url=sandbox.base_url,
            app_id=APP_ID,
            app_secret=APP_SECRET,
            encrypt_key=ENCRYPT_KEY,
            verification_token=VERIFICATION_TOKEN,
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0, token="demo-admin-token"),
        api=ApiSettings(token=API_TOKEN),
        card=CardSettings(session_detail_url="https://agent.example.com/sessions/{session_id}"),
        images=ImagesSettings(root=workdir),  # the script's generated image lives there
    )


class DemoRun:
    """The script's moves: runtime events, user clicks, and what the card looks like after each."""

    def __init__(
        self,
        fp: FeishuProgressClient,
        http: aiohttp.ClientSession,
        base_url: str,
        sandbox: RunningSandbox,
        out: Print,
        *,
        services: Services,
        admin_url: str,
    ) -> None:
        self.fp = fp  # the runtime's side
        self.http = http  # Feishu's side: the clicks
        self.base_url = base_url
        self.sandbox = sandbox
        self.out = out
        self.services = services  # the service's own side (live cards, metrics)
        self.admin_url = admin_url
        self.session_id = 0
        self.message_id = ""
        self.events_sent = 0
        self.cursor = 0
        self.step_no = 0

    def another(self) -> DemoRun:
        """Moves for one more task on the same service and connections."""
        return DemoRun(
            self.fp,
            self.http,
            self.base_url,
            self.sandbox,
            self.out,
            services=self.services,
            admin_url=self.admin_url,
        )

    async def create_task(self, title: str) -> None:
        created = await self.fp.create_task(
            receive_id=CHAT, receive_id_type="chat_id", requester_open_id=REQUESTER, title=title
        )
        self.session_id, self.message_id = created.session_id, created.message_id

    async def send(self, *events: Mapping[str, Any]) -> None:
        self.events_sent += await self.fp.post_events(self.session_id, events)

    async def click(
        self, operator: str, value: Mapping[str, Any], form: Mapping[str, Any] | None = None
    ) -> str:
        payload = card_action_payload(
            open_id=operator,
            message_id=self.message_id,
            chat_id=CHAT,
            value=value,
            form_value=form,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
        )
        body, headers = signed_request(payload, encrypt_key=ENCRYPT_KEY, now=time.time())
        async with self.http.post(f"{self.base_url}/feishu/callback", data=body, headers=headers) as response:
            reply = await response.json()
        toast = reply.get("toast", {})
        return f"{toast.get('type', '-')}: {toast.get('content', '')}"

    async def actions(self, wait: float = 5.0) -> list[UserAction]:
        page = await self.fp.poll_actions(self.session_id, after=self.cursor, wait=wait)
        self.cursor = page.cursor
        return page.actions

    async def show(self, title: str) -> None:
        await asyncio.sleep(SETTLE_SECONDS)
        self.step_no += 1
        self.out(f"\n── {self.step_no}. {title} " + "─" * max(3, 60 - len(title)))
        message = self.sandbox.state.messages[self.message_id]
        self.out(card_as_text(message.card))


def click_value(action: str, session_id: int, **extra: Any) -> dict[str, Any]:
    """A button's callback value as the card carries it."""
    return {"v": 1, "action": action, "session_id": session_id, **extra}


# -- the script: what the runtime sends, chapter by chapter ------------------------------------------

SUBAGENT_EVENTS: tuple[dict[str, Any], ...] = (
    {"type": "status", "status": "RUNNING", "round": 1},
    {"type": "content_delta", "text": "我先梳理一下**进度卡**的更新链路,再派两个子代理并行处理。"},
    {"type": "tool_started", "call_id": "c1", "name": "spawn_subagent", "args": {"agent_type": "explorer"}},
    {"type": "tool_finished", "call_id": "c1", "result": {"task_id": 11, "status": "RUNNING"}},
    {
        "type": "subagent_started",
        "task_id": 11,
        "child_session_id": 9001,
        "agent_type": "explorer",
        "title": "后台子代理(explorer): 排查卡片进度链路",
        "invocation_type": "BACKGROUND",
    },
    {"type": "tool_started", "call_id": "c2", "name": "spawn_subagent", "args": {"agent_type": "worker"}},
    {"type": "tool_finished", "call_id": "c2", "result": {"task_id": 12, "status": "RUNNING"}},
    {
        "type": "subagent_started",
        "task_id": 12,
        "child_session_id": 9002,
        "agent_type": "worker",
        "title": "实现子代理展示",
        "invocation_type": "BACKGROUND",
    },
    {"type": "subagent_round", "task_id": 11, "round": 2},
    {"type": "subagent_status", "task_id": 12, "status": "RECOVERING"},
)

ASK_EVENT: dict[str, Any] = {
    "type": "ask",
    "ask_id": "ask-1",
    "questions": [
        {"question": "先优化哪一部分?", "options": ["卡片限流", "子代理展示", "工具摘要"]},
        {
            "question": "验收时想看到什么?",
            "options": ["本地 demo", "截图对比", "压测报告"],
            "multiSelect": True,
        },
    ],
}
ANSWERS_FORM: dict[str, Any] = {"q0_0": "1", "q0_1": ["0", "2"], "q0_1_other": "再加一份指标截图"}

ASKTOOL_EVENTS: tuple[dict[str, Any], ...] = (
    {
        "type": "tool_started",
        "call_id": "c7",
        "name": "asktool",
        "args": {
            "questions": [
                {"question": "是否同时修复钉钉卡片?", "options": ["是", "否"]},
                {"question": "需要哪些语言?", "options": ["中文", "English", "日本語"], "multiSelect": True},
            ]
        },
    },
    {
        "type": "tool_finished",
        "call_id": "c7",
        "result": "是否同时修复钉钉卡片?：否\n---\n需要哪些语言?：中文、English",
    },
    {"type": "subagent_finished", "task_id": 11, "status": "COMPLETED", "total_rounds": 3},
)

SUBAGENT_PROGRESS_EVENTS: tuple[dict[str, Any], ...] = (
    {"type": "tool_started", "call_id": "c8", "name": "check_subagent", "args": {"task_id": 12}},
    {
        "type": "tool_finished",
        "call_id": "c8",
        "result": {
            "background_subagents": [
                {
                    "taskId": 12,
                    "childSessionId": 9002,
                    "agentType": "worker",
                    "status": "RUNNING",
                    "totalRounds": 4,
                    "totalToolCalls": 9,
                    "totalPromptTokens": 12000,
                    "totalCompletionTokens": 3400,
                    "recentOutput": "正在修改 progress-card.ts 并补测试……",
                }
            ]
        },
    },
    {"type": "content", "text": "已按回答优先处理**子代理展示**;限流部分由子代理并行排查。"},
)

FINAL_EVENTS: tuple[dict[str, Any], ...] = (
    {"type": "subagent_finished", "task_id": 12, "status": "CANCELLED", "total_rounds": 4},
    {
        "type": "finished",
        "status": "CANCELLED",
        "content": "任务已按你的要求取消。已完成:限流排查结论已写入会话。",
    },
)


def _image(url: str, path: str) -> dict[str, Any]:
    return {"image_url": url, "image_path": path, "size_bytes": 2048, "mime": "image/png"}


def _image_result(prompt: str, *images: dict[str, Any]) -> dict[str, Any]:
    return {"images": list(images), "model": "gpt-image-1", "size": "1024x1024", "prompt": prompt}


def failing_tool_events(image_path: Path) -> tuple[dict[str, Any], ...]:
    generated = _image("/uploads/cat.png", str(image_path)) | {"source": "generated"}
    return (
        {"type": "tool_started", "call_id": "c3", "name": "shell", "args": {"command": "pytest -q tests/"}},
        {
            "type": "tool_finished",
            "call_id": "c3",
            "result": {"exit_code": 2, "stdout": "2 failed, 40 passed"},
        },
        {
            "type": "tool_started",
            "call_id": "c4",
            "name": "web_search",
            "args": {"query": "飞书卡片 限流 230020"},
        },
        {"type": "tool_finished", "call_id": "c4", "result": {"error": "无可用搜索凭据"}},
        {
            "type": "tool_started",
            "call_id": "c5",
            "name": "generate_image",
            "args": {"prompt": "一只盯着仪表盘的猫"},
        },
        {"type": "tool_finished", "call_id": "c5", "result": _image_result("一只盯着仪表盘的猫", generated)},
    )


def edited_image_events(image_path: Path) -> tuple[dict[str, Any], ...]:
    missing = _image("/uploads/missing.png", "/nonexistent/missing.png") | {"size_bytes": 4096}
    edited = _image_result("给猫加一副眼镜", _image("/uploads/cat-glasses.png", str(image_path)), missing)
    return (
        {"type": "tool_started", "call_id": "c9", "name": "edit_image", "args": {"prompt": "给猫加一副眼镜"}},
        {"type": "tool_finished", "call_id": "c9", "result": edited},
    )


def answers_events(chosen: Sequence[Answer]) -> tuple[dict[str, Any], ...]:
    """The runtime hands the answers it read from the action log to its ask tool, whose result shows them."""
    answers = [
        {"question": a.question, "selectedLabels": a.selected_labels, "customInput": a.custom_input or None}
        for a in chosen
    ]
    return (
        {"type": "status", "status": "RUNNING", "round": 2},
        {"type": "tool_started", "call_id": "c6", "name": "ask_user_questions"},
        {"type": "tool_finished", "call_id": "c6", "result": {"answers": answers}},
    )


async def _created(run: DemoRun, image_path: Path) -> str:
    await run.create_task("调研飞书卡片限流并修复进度卡")
    return "task created: the first card"


async def _subagents(run: DemoRun, image_path: Path) -> str:
    await run.send(*SUBAGENT_EVENTS)
    return "two background subagents running"


STREAMED_ANSWER = (
    "限流的根因找到了:每张卡片每秒最多更新 5 次,整个应用每分钟 1000 次。",
    "所以进度卡把**正文**放进 CardKit 卡片实体里流式输出(打字机效果),",
    "状态、工具和子代理面板则按自己的节奏整卡更新,",
    "两者共用一个递增的 sequence,谁也不会挤掉谁。",
)
STREAM_DELTA_SECONDS = 0.08  # a model's pace: a few words at a time


async def _streamed(run: DemoRun, image_path: Path) -> str:
    for sentence in STREAMED_ANSWER:
        for start in range(0, len(sentence), 6):
            await run.send({"type": "content_delta", "text": sentence[start : start + 6]})
            await asyncio.sleep(STREAM_DELTA_SECONDS)
    return "the answer streams in small pieces (CardKit: typed out live; PATCH: whole-card updates)"


async def _failures(run: DemoRun, image_path: Path) -> str:
    await run.send(*failing_tool_events(image_path))
    return "a failing shell call, a failed search, a generated image"


async def _questions(run: DemoRun, image_path: Path) -> str:
    await run.send(ASK_EVENT)
    return "the agent asks two questions (WAITING, a form)"


async def _answered_round(run: DemoRun, image_path: Path) -> str:
    submit = click_value("answers", run.session_id, ask_id="ask-1")
    run.out(
        f"   bob (not the requester) submits answers → {await run.click(BYSTANDER, submit, ANSWERS_FORM)}"
    )
    run.out(f"   alice submits answers → {await run.click(REQUESTER, submit, ANSWERS_FORM)}")
    received = await run.actions()
    run.out(f"   runtime reads the action log: {[a.kind for a in received]}")
    answered = received[-1]
    if not isinstance(answered, AnswersAction):
        raise RuntimeError(f"expected the answers, the log holds {answered.kind!r}")
    await run.send(
        *answers_events(answered.payload.answers),
        *ASKTOOL_EVENTS,
        *edited_image_events(image_path),
        *SUBAGENT_PROGRESS_EVENTS,
    )
    return "round 2: every rich view at once (answers, asktool, images, subagent progress)"


async def _cancel_clicked(run: DemoRun, image_path: Path) -> str:
    run.out(f"   alice clicks 取消任务 → {await run.click(REQUESTER, click_value('cancel', run.session_id))}")
    return "cancel clicked: the toast says 正在取消任务; the card shows 正在取消… with its next write (~1 s)"


async def _stopped(run: DemoRun, image_path: Path) -> str:
    received = await run.actions()
    run.out(f"   runtime reads the action log: {[a.kind for a in received]}")
    await run.send(*FINAL_EVENTS)
    return "the runtime stops: final card"


# The demo, as a table: each step does its part, then the card is shown under the step's caption.
SCRIPT: tuple[Callable[[DemoRun, Path], Awaitable[str]], ...] = (
    _created,
    _subagents,
    _streamed,
    _failures,
    _questions,
    _answered_round,
    _cancel_clicked,
    _stopped,
)


async def _script(run: DemoRun, image_path: Path) -> None:
    for step in SCRIPT:
        await run.show(await step(run, image_path))


async def run_demo(out: Print = print, *, hold: Hold | None = None) -> DemoResult:
    """Play the scripted task and return what happened.

    ``hold(result, page_url)``, when given, runs after the script while the service, the sandbox and the
    preview page are still up (``demo --serve``); they stop when it returns.
    """
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="feishu-progress-demo-") as tmp:
        workdir = Path(tmp)
        image_path = workdir / "cat.png"
        image_path.write_bytes(tiny_png())
        async with demo_service(workdir, out) as run:
            page = f"{run.base_url}/sandbox/?token={API_TOKEN}"
            if hold is not None:  # first: the page shows the card while the script plays
                out(f"sandbox preview (live cards, clickable): {page}")
            await _script(run, image_path)
            result = _result(
                run, run.sandbox, await _metrics_lines(run.http, run.admin_url), time.monotonic() - started
            )
            if hold is not None:
                await hold(result, page)
        return result


@asynccontextmanager
async def demo_service(
    workdir: Path,
    out: Print = print,
    *,
    sandbox: SandboxConfig | None = None,
    settings: Mapping[str, Any] | None = None,
) -> AsyncIterator[DemoRun]:
    """The service (SQLite in ``workdir``) against its own sandbox, served on a free port, with a runtime
    client and Feishu's side: what the demo plays on, and what tests drive the same way. ``settings``
    replaces top-level groups of ``demo_settings`` (e.g. ``{"card": CardSettings(transport="patch")}``)."""
    async with run_sandbox(sandbox or SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)) as running:
        app = create_app(
            demo_settings(running, workdir).model_copy(update=dict(settings or {})), sandbox=running
        )
        async with (
            serving(app) as base_url,
            FeishuProgressClient(base_url, API_TOKEN) as fp,
            aiohttp.ClientSession() as http,
        ):
            yield DemoRun(fp, http, base_url, running, out, services=app[SERVICES], admin_url=app[ADMIN_URL])


def _result(run: DemoRun, sandbox: RunningSandbox, metrics: list[str], seconds: float) -> DemoResult:
    message = sandbox.state.messages[run.message_id]
    return DemoResult(
        session_id=run.session_id,
        message_id=run.message_id,
        events=run.events_sent,
        patches=sandbox.state.requests.get("patch", 0),
        cardkit=sandbox.state.cardkit.stats(),
        responses=dict(message.responses),
        final_status=_final_status(message.card),
        seconds=seconds,
        metrics=metrics,
        largest_card_bytes=max(card_bytes(card) for _, card in message.history),
        largest_card_elements=max(element_count(card) for _, card in message.history),
    )


async def _metrics_lines(http: aiohttp.ClientSession, admin_url: str) -> list[str]:
    async with http.get(f"{admin_url}/metrics") as response:
        text = await response.text()
    wanted = (
        "fp_events_total",
        "fp_patches_total",
        "fp_rate_limit_hits_total",
        "fp_live_cards",
        "fp_callback_latency_seconds_count",
        "fp_subagent_cache_total",
        "fp_delivery_staleness_seconds_count",
    )
    return [line for line in text.splitlines() if line.startswith(wanted)]


def _final_status(card: Mapping[str, Any]) -> str:
    header = card.get("header", {})
    tags = header.get("text_tag_list", []) if isinstance(header, Mapping) else []
    return str(tags[0]["text"]["content"]) if tags else "?"


def _summary(out: Print, result: DemoResult) -> None:
    out("\n── summary " + "─" * 50)
    out(f"task {result.session_id} · message {result.message_id} · final state: {result.final_status}")
    out(f"runtime events sent: {result.events}")
    if result.cardkit.get("cards"):
        kit = result.cardkit
        out(
            f"transport: CardKit — the answer text streamed into the card ({kit['content']} streamed texts, "
            f"{kit['full']} whole-card updates, {kit['settings']} streaming switches)"
        )
    else:
        out(f"transport: message PATCH — {result.patches} card PATCHes delivered to the sandbox")
    out(f"sandbox answers on this message by code: {result.responses} (0 = ok, 230020/99991400 = limited)")
    out(
        f"largest card sent: {result.largest_card_bytes:,} bytes, {result.largest_card_elements} elements "
        "(Feishu's limits: 30 KB, 200)"
    )
    out(f"took {result.seconds:.1f} s")
    out("metrics after the run (admin /metrics):")
    for line in result.metrics:
        out(f"   {line}")


async def until_stopped() -> None:
    """Return on SIGINT (Ctrl-C) or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def main(out: Print = print, *, serve: bool = False) -> int:
    """Play the demo; with ``serve``, keep the sandbox and its preview page up until Ctrl-C."""

    async def hold(result: DemoResult, page_url: str) -> None:
        _summary(out, result)
        out(f"\nthe service, the sandbox and the page ({page_url}) keep running: Ctrl-C stops them")
        await until_stopped()
        out("stopping")

    result = asyncio.run(run_demo(out, hold=hold if serve else None))
    if not serve:
        _summary(out, result)
    return 0
