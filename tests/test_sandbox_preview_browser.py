"""The sandbox preview page in a real browser: the distribution's Chromium, driven by Playwright.

The service runs in-process in sandbox mode (SQLite in tmp_path, its own sandbox, callback keys set so
every click is signed and encrypted) and is driven over HTTP with the runtime API, as a runtime would.
Without Chromium (or the playwright package) the tests skip, except under CI=true where they fail.

``FP_WRITE_SCREENSHOT=1`` also writes the README's screenshot to docs/sandbox-preview.png.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from feishu_progress.app import SANDBOX_APP_ID, SERVICES, create_app
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    FeishuSettings,
    HttpSettings,
    ImagesSettings,
    Settings,
)
from feishu_progress.demo import tiny_png
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.sandbox import RunningSandbox, SandboxMessage

KEY, VTOKEN, API_TOKEN = "browser-encrypt-key", "browser-verification-token", "browser-api-token"
REQUESTER, BYSTANDER = "ou_alice", "ou_bob"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "sandbox-preview.png"
WAIT_MS = 10_000
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires the browser test to run", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        _unavailable("Chromium is not installed (apt-get install -y chromium)")
    return path


try:
    from playwright.async_api import ConsoleMessage, Page, async_playwright, expect
except ImportError:  # pragma: no cover - the dev extra installs it
    async_playwright = None  # type: ignore[assignment]


@dataclass
class Service:
    """The service under test: its URL, the runtime API, and the sandbox it started."""

    base_url: str
    http: aiohttp.ClientSession
    sandbox: RunningSandbox

    async def create_task(self, title: str) -> tuple[int, str]:
        body = {
            "receive_id": "oc_team",
            "receive_id_type": "chat_id",
            "requester_open_id": REQUESTER,
            "title": title,
        }
        async with self.http.post(f"{self.base_url}/v1/tasks", json=body) as response:
            data = await response.json()
            assert response.status == 201, data
        return data["session_id"], data["message_id"]

    async def send(self, session_id: int, *events: Mapping[str, Any]) -> None:
        url = f"{self.base_url}/v1/tasks/{session_id}/events"
        async with self.http.post(url, json={"events": list(events)}) as response:
            assert response.status == 202, await response.text()

    async def actions(self, session_id: int, after: int = 0, wait: float = 5.0) -> list[dict[str, Any]]:
        url = f"{self.base_url}/v1/tasks/{session_id}/actions"
        async with self.http.get(url, params={"after": str(after), "wait": str(wait)}) as response:
            found: list[dict[str, Any]] = (await response.json())["actions"]
        return found


@dataclass
class Browser:
    page: Page
    errors: list[str] = field(default_factory=list)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'browser.db'}",
        feishu=FeishuSettings(encrypt_key=KEY, verification_token=VTOKEN),  # sandbox mode: no app id
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=API_TOKEN),
        images=ImagesSettings(root=tmp_path),  # the generated image below lies there
    )
    app = create_app(settings, registry=CollectorRegistry())
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        sandbox = app[SERVICES].sandbox
        assert sandbox is not None
        async with aiohttp.ClientSession(headers=AUTH) as http:
            yield Service(f"http://{host}:{port}", http, sandbox)
    finally:
        await runner.cleanup()


@pytest.fixture
async def browser(service: Service) -> AsyncIterator[Browser]:
    if async_playwright is None:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    executable = chromium_path()
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            context = await chromium.new_context(viewport={"width": 1200, "height": 900}, locale="zh-CN")
            opened = Browser(await context.new_page())

            def on_console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    opened.errors.append(f"console: {message.text}")

            opened.page.on("pageerror", lambda error: opened.errors.append(f"pageerror: {error}"))
            opened.page.on("console", on_console)
            # Visiting with the token once sets the page's HttpOnly cookie and redirects to /sandbox/.
            await opened.page.goto(f"{service.base_url}/sandbox/?token={API_TOKEN}")
            await expect(opened.page.locator("#conn")).to_have_text("live", timeout=WAIT_MS)
            yield opened
        finally:
            await chromium.close()


def card_of(page: Page, message_id: str) -> Any:
    return page.locator(f'article[data-message-id="{message_id}"]')


async def confirm_cancel(page: Page, message_id: str) -> None:
    await card_of(page, message_id).get_by_role("button", name="取消任务").click()
    dialog = page.locator("#confirm")
    await expect(dialog).to_be_visible(timeout=WAIT_MS)
    await expect(dialog).to_contain_text("取消任务?")
    await page.locator("#confirm-ok").click()


# --- the scenario ----------------------------------------------------------------------------------------


CONTENT = "先梳理**进度卡**的更新链路:\n\n1. 读 `scheduler.py`\n2. 派两个子代理并行排查\n\n> 限流码见 230020"


async def running_task(service: Service, image: Path) -> tuple[int, str]:
    """A task mid-run: two background subagents, tools, a generated image, markdown content."""
    session_id, message_id = await service.create_task("调研飞书卡片限流并修复进度卡")
    await service.send(
        session_id,
        {"type": "status", "status": "RUNNING", "round": 3},
        {"type": "content_delta", "text": CONTENT},
        {"type": "tool_started", "call_id": "c1", "name": "shell", "args": {"command": "pytest -q tests/"}},
        {
            "type": "tool_finished",
            "call_id": "c1",
            "result": {"exit_code": 2, "stdout": "2 failed, 40 passed"},
        },
        {"type": "tool_started", "call_id": "c2", "name": "generate_image", "args": {"prompt": "一只猫"}},
        {
            "type": "tool_finished",
            "call_id": "c2",
            "result": {
                "images": [
                    {
                        "image_url": "/u/cat.png",
                        "image_path": str(image),
                        "size_bytes": 2048,
                        "mime": "image/png",
                    }
                ]
            },
        },
        {
            "type": "subagent_started",
            "task_id": 11,
            "child_session_id": 9001,
            "agent_type": "explorer",
            "title": "排查卡片进度链路",
            "invocation_type": "BACKGROUND",
        },
        {
            "type": "subagent_started",
            "task_id": 12,
            "child_session_id": 9002,
            "agent_type": "worker",
            "title": "实现子代理展示",
            "invocation_type": "BACKGROUND",
        },
        {"type": "subagent_round", "task_id": 11, "round": 2},
    )
    return session_id, message_id


ASK = {
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


async def test_cards_render_live_and_clicks_reach_the_service(
    service: Service, browser: Browser, tmp_path: Path
) -> None:
    page = browser.page
    image = tmp_path / "cat.png"
    image.write_bytes(tiny_png(32, 32))
    running_id, running_message = await running_task(service, image)
    asking_id, asking_message = await service.create_task("确认验收方式")
    await service.send(asking_id, {"type": "status", "status": "RUNNING", "round": 1}, ASK)

    # The running card: header, subagent section, tools, the uploaded image (inside its panel).
    running = card_of(page, running_message)
    await expect(running).to_contain_text("子代理 · 2 个运行中", timeout=WAIT_MS)
    await expect(running.locator(".card-header")).to_contain_text("调研飞书卡片限流并修复进度卡")
    await expect(running.locator(".card-header")).to_have_class("card-header tpl-blue")
    await expect(running.locator("code").first).to_have_text("scheduler.py")
    await running.locator("summary", has_text="生成图片").click()
    await expect(running.locator("img.img")).to_be_visible(timeout=WAIT_MS)
    asking = card_of(page, asking_message)
    await expect(asking.locator("form")).to_be_visible(timeout=WAIT_MS)
    await expect(asking.locator(".card-header")).to_have_class("card-header tpl-orange")
    await _screenshots(page, tmp_path)

    await _live_update(service, page, running_id, running_message)
    await _locale_switch(page, running_message)
    await _submit_answers(service, page, asking_id, asking_message)
    await _cancel(service, page, asking_id, asking_message)
    await _readable_at(page, 400, tmp_path)
    await _readable_at(page, 1200, tmp_path)
    assert browser.errors == []


async def _screenshots(page: Page, tmp_path: Path) -> None:
    await page.evaluate("window.scrollTo(0, 0)")  # a full-page shot of a scrolled page repeats the sticky bar
    await page.screenshot(path=str(tmp_path / "sandbox-preview.png"), full_page=True)
    if os.environ.get("FP_WRITE_SCREENSHOT") == "1":
        await page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert (tmp_path / "sandbox-preview.png").stat().st_size > 10_000


async def _live_update(service: Service, page: Page, session_id: int, message_id: str) -> None:
    """A new event reaches the open page without a reload, within 1 s of the sandbox accepting it."""
    marker = "live-update-7f3a"
    accepted: list[float] = []

    def listener(message: SandboxMessage) -> None:
        if message.message_id == message_id and not accepted and marker in json.dumps(message.card):
            accepted.append(time.monotonic())

    service.sandbox.state.listeners.append(listener)
    try:
        before = int((await card_of(page, message_id).locator(".badge.updates").inner_text()).split()[0])
        await service.send(session_id, {"type": "content_delta", "text": f"\n\n{marker}"})
        await page.wait_for_function(
            "([id, marker]) => document.querySelector(`article[data-message-id='${id}']`)"
            "?.textContent.includes(marker)",
            arg=[message_id, marker],
            polling="raf",
            timeout=WAIT_MS,
        )
        seen = time.monotonic()
    finally:
        service.sandbox.state.listeners.remove(listener)
    assert accepted, "the sandbox never accepted the update"
    assert seen - accepted[0] < 1.0, f"the page showed the update {seen - accepted[0]:.2f} s after the PATCH"
    after = int((await card_of(page, message_id).locator(".badge.updates").inner_text()).split()[0])
    assert after > before


async def _locale_switch(page: Page, message_id: str) -> None:
    card = card_of(page, message_id)
    await card.locator("select.locale-switch").select_option("en_us")
    await expect(card_of(page, message_id)).to_contain_text("Subagents · 2 running")
    await card_of(page, message_id).locator("select.locale-switch").select_option("zh_cn")
    await expect(card_of(page, message_id)).to_contain_text("子代理 · 2 个运行中")


async def _submit_answers(service: Service, page: Page, session_id: int, message_id: str) -> None:
    form = card_of(page, message_id).locator("form")
    await form.locator("select").first.select_option(label="子代理展示")
    await form.locator(".mselect-toggle").click()
    await form.locator(".mselect-option", has_text="本地 demo").click()
    await form.locator(".mselect-option", has_text="压测报告").click()
    await form.locator(".mselect-toggle").click()  # closes the menu, as a person would
    await expect(form.locator(".mselect-menu")).to_be_hidden()
    await expect(form.locator(".mselect-chip")).to_have_text(["本地 demo", "压测报告"])
    await form.locator("input.field").nth(1).fill("再加一份指标截图")
    await form.get_by_role("button", name="提交回答").click()
    await expect(page.locator(".toast").last).to_contain_text("回答已提交", timeout=WAIT_MS)
    [action] = await service.actions(session_id)
    assert action["kind"] == "answers" and action["operator_open_id"] == REQUESTER
    answers = action["payload"]["answers"]
    assert [a["selected_labels"] for a in answers] == [["子代理展示"], ["本地 demo", "压测报告"]]
    assert answers[1]["custom_input"] == "再加一份指标截图"


async def _cancel(service: Service, page: Page, session_id: int, message_id: str) -> None:
    # Clicking as someone else (the operator picker): the service refuses, nothing is recorded.
    await page.locator("#operator").fill(BYSTANDER)
    await confirm_cancel(page, message_id)
    await expect(page.locator(".toast", has_text="只有发起人")).to_be_visible(timeout=WAIT_MS)
    # As the requester (the default): one cancel reaches the runtime.
    await page.locator("#operator").fill("")
    await confirm_cancel(page, message_id)
    await expect(page.locator(".toast", has_text="正在取消任务")).to_be_visible(timeout=WAIT_MS)
    logged = await service.actions(session_id)
    assert [action["kind"] for action in logged] == ["answers", "cancel"]
    assert logged[1]["operator_open_id"] == REQUESTER
    await expect(card_of(page, message_id)).to_contain_text("正在取消", timeout=WAIT_MS)


async def _readable_at(page: Page, width: int, tmp_path: Path) -> None:
    await page.set_viewport_size({"width": width, "height": 900})
    await page.screenshot(path=str(tmp_path / f"sandbox-preview-{width}.png"), full_page=True)
    overflow = await page.evaluate("document.documentElement.scrollWidth")
    assert overflow <= width, f"the page is {overflow} px wide in a {width} px window"
    for card in await page.locator(".card").all():
        box = await card.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5


# --- untrusted card text --------------------------------------------------------------------------------

HOSTILE = (
    "**bold** <script>window.__pwned = 1</script> "
    '<img src=x onerror="window.__pwned = 2"> '
    "[js-link](javascript:window.__pwned=3) "
    "<a href='javascript:window.__pwned=4'>a-link</a> "
    "<font color='red\" onmouseover=\"window.__pwned=5'>font-text</font> "
    "&#60;script&#62;entity-escaped&#60;/script&#62; "
    "<at id=all></at> <text_tag color='red'>tag-text</text_tag> "
    "[safe](https://example.com/ok)"
)


def raw_cards(sandbox: RunningSandbox) -> FeishuClient:
    """A Feishu client of the sandbox's app: cards sent with it skip our escaping (untrusted JSON)."""
    secret = sandbox.state.config.app_secret  # made up when the service started its sandbox
    settings = FeishuSettings(base_url=sandbox.base_url, app_id=SANDBOX_APP_ID, app_secret=secret)
    return FeishuClient(settings)


async def _send_raw_card(sandbox: RunningSandbox, card: dict[str, Any]) -> str:
    async with raw_cards(sandbox) as client:
        return await client.send_card("oc_raw_cards", "chat_id", card, "")


async def test_untrusted_card_text_is_shown_as_text(service: Service, browser: Browser) -> None:
    page = browser.page
    card = {
        "schema": "2.0",
        "config": {"update_multi": True},
        "header": {"title": {"tag": "plain_text", "content": "<img src=x onerror=window.__pwned=6>title"}},
        "body": {
            "elements": [
                {"tag": "markdown", "content": HOSTILE},
                {"tag": "button", "text": {"tag": "plain_text", "content": "<b>btn</b>"},
                 "behaviors": [{"type": "open_url", "default_url": "javascript:window.__pwned=7"}]},
            ]
        },
    }  # fmt: skip
    message_id = await _send_raw_card(service.sandbox, card)
    shown = card_of(page, message_id)
    await expect(shown).to_contain_text("<script>window.__pwned = 1</script>", timeout=WAIT_MS)
    await expect(shown).to_contain_text('<img src=x onerror="window.__pwned = 2">')
    await expect(shown).to_contain_text("<script>entity-escaped</script>")
    await expect(shown.locator(".card-header")).to_contain_text("<img src=x onerror=window.__pwned=6>title")
    await expect(shown.locator("strong")).to_have_text("bold")
    await expect(shown.locator(".mention")).to_have_text("@all")
    await expect(shown.locator(".tag-red")).to_have_text("tag-text")
    await expect(shown.locator("button", has_text="<b>btn</b>")).to_be_visible()
    await shown.locator("button", has_text="<b>btn</b>").click()  # a javascript: URL is never opened
    await shown.locator("span", has_text="font-text").hover()
    assert await shown.locator("img, script, iframe, object").count() == 0
    hrefs = await shown.locator("a").evaluate_all("links => links.map(link => link.getAttribute('href'))")
    assert hrefs == ["https://example.com/ok"]
    assert await shown.locator("a").get_attribute("rel") == "noopener noreferrer"
    assert await page.evaluate("window.__pwned") is None
    assert len(page.context.pages) == 1
    assert browser.errors == []


# --- what the renderer draws ---------------------------------------------------------------------------

MARKDOWN = "\n".join(
    [
        "#### Heading four",
        "Line one with **bold**, *italic*, ~~strike~~ and `code`",
        "line two after a break, <font color='red'>red text</font>,",
        "<text_tag color='blue'>blue tag</text_tag>,",
        "<at id=ou_carol></at> and [a link](https://example.com/doc) and snake_case_name",
        "",
        "- item one",
        "    - nested item",
        "- item two",
        "1. first",
        "2. second",
        "",
        "> quoted text",
        "",
        "```python",
        "print('<b>not bold</b>')",
        "```",
        "",
        "| col a | col b |",
        "| --- | --- |",
        "| cell 1 | cell 2 |",
    ]
)


def plain(content: str, **i18n: str) -> dict[str, Any]:
    text: dict[str, Any] = {"tag": "plain_text", "content": content}
    if i18n:
        text["i18n_content"] = i18n
    return text


def markdown(content: str) -> dict[str, Any]:
    return {"tag": "markdown", "content": content}


def panel(title: str, expanded: bool) -> dict[str, Any]:
    header = {"title": markdown(title)}
    return {
        "tag": "collapsible_panel",
        "expanded": expanded,
        "header": header,
        "elements": [markdown(f"inside the {title}")],
    }


def columns(*contents: dict[str, Any], weighted: bool = False) -> dict[str, Any]:
    width: dict[str, Any] = {"width": "weighted", "weight": 1} if weighted else {"width": "auto"}
    return {"tag": "column_set", "columns": [{"tag": "column", **width, "elements": [c]} for c in contents]}


BUTTON_KINDS = ("default", "primary", "danger", "primary_filled", "text")
FORM = {
    "tag": "form",
    "name": "form_1",
    "elements": [
        {"tag": "select_static", "name": "pick", "placeholder": plain("pick one"),
         "options": [{"text": plain("one"), "value": "1"}, {"text": plain("two"), "value": "2"}]},
        {"tag": "multi_select_static", "name": "many", "required": True, "placeholder": plain("pick many"),
         "options": [{"text": plain("x"), "value": "x"}]},
        {"tag": "input", "name": "free", "placeholder": plain("type here", en_us="type here (en)")},
        {"tag": "button", "name": "send", "form_action_type": "submit", "text": plain("send"),
         "behaviors": [{"type": "callback", "value": {"v": 1, "action": "answers", "session_id": 999}}]},
    ],
}  # fmt: skip
EVERY_COMPONENT = {
    "schema": "2.0",
    "config": {"update_multi": True, "locales": ["zh_cn", "en_us", "ja_jp"], "streaming_mode": True},
    "header": {
        "title": plain("组件", en_us="Components", ja_jp="コンポーネント"),
        "template": "violet",
        "subtitle": plain("subtitle text"),
    },
    "body": {
        "elements": [
            {**markdown(MARKDOWN), "element_id": "md_main"},
            {"tag": "div", "text": {"tag": "plain_text", "content": "div text", "text_color": "green"}},
            {"tag": "hr"},
            columns(markdown("left column"), markdown("right column"), weighted=True),
            panel("open panel", True),
            panel("closed panel", False),
            {"tag": "img", "img_key": "img_not_uploaded"},
            {"tag": "img_combination", "combination_mode": "double",
             "img_list": [{"img_key": "img_stored"}, {"img_key": "img_missing"}]},
            columns(*({"tag": "button", "type": kind, "text": plain(kind)} for kind in BUTTON_KINDS)),
            FORM,
        ]
    },
}  # fmt: skip


async def test_every_component_is_drawn(service: Service, browser: Browser, tmp_path: Path) -> None:
    page = browser.page
    service.sandbox.state.images["img_stored"] = tiny_png(8, 8)
    message_id = await _send_raw_card(service.sandbox, EVERY_COMPONENT)
    card = card_of(page, message_id)
    await expect(card.locator(".card-header")).to_have_class("card-header tpl-violet", timeout=WAIT_MS)
    await expect(card.locator(".card-header .subtitle")).to_have_text("subtitle text")
    md = card.locator(".md").first
    await expect(md.locator("h4")).to_have_text("Heading four")
    for selector, expected in [
        ("strong", "bold"), ("em", "italic"), ("del", "strike"), ("p code", "code"), (".fc-red", "red text"),
        (".tag-blue", "blue tag"), (".mention", "@ou_carol"), ("blockquote", "quoted text"),
        ("pre code", "print('<b>not bold</b>')"), ("a[href='https://example.com/doc']", "a link"),
        ("ul > li > ul > li", "nested item"), ("ol > li >> nth=1", "second"), ("td >> nth=1", "cell 2"),
    ]:  # fmt: skip
        await expect(md.locator(selector).first).to_have_text(expected)
    await expect(md).to_contain_text("snake_case_name")
    assert await md.locator("br").count() >= 2  # a newline inside a paragraph is a line break
    await expect(card.locator(".fc-green")).to_have_text("div text")
    await expect(card.locator(".column.weighted")).to_have_count(2)
    await expect(card.locator("details.panel").nth(0)).to_have_attribute("open", "")
    await expect(card.locator("details.panel").nth(1)).not_to_have_attribute("open", "")
    await expect(card.locator(".img-missing").first).to_have_text("image img_not_uploaded")
    await expect(card.locator(".img-grid.double img")).to_have_count(1)
    await expect(card.locator(".img-grid.double .img-missing")).to_have_text("image img_missing")
    for kind in BUTTON_KINDS:
        await expect(card.locator(f"button.btn-{kind}", has_text=kind)).to_be_visible()
    await expect(card.locator(".streaming-mark")).to_be_visible()
    await expect(card.locator(".streaming")).to_have_count(1)
    # Streaming mode: text that extends the element's text is typed out, then shown whole.
    longer = json.loads(json.dumps(EVERY_COMPONENT))
    longer["body"]["elements"][0]["content"] = MARKDOWN + "\n\nstreamed tail **arrives**"
    async with raw_cards(service.sandbox) as client:
        await client.patch_card(message_id, longer)
    await expect(card_of(page, message_id).locator(".streaming")).to_contain_text("streamed tail arrives")
    await expect(card_of(page, message_id).locator(".badge.updates")).to_have_text("1 update")

    # The locale switch offers the card's locales and redraws the i18n_content texts.
    await card.locator("select.locale-switch").select_option("en_us")
    await expect(card_of(page, message_id).locator(".card-header .title")).to_have_text("Components")
    await expect(card_of(page, message_id).locator("input.field")).to_have_attribute(
        "placeholder", "type here (en)"
    )
    options = await card_of(page, message_id).locator("select.locale-switch option").all_inner_texts()
    assert options == ["zh_cn", "en_us", "ja_jp"]

    # A required multi-select left empty: the page refuses to submit, as Feishu does; nothing is sent.
    form = card_of(page, message_id).locator("form")
    await form.get_by_role("button", name="send").click()
    await expect(page.locator(".toast", has_text="required")).to_be_visible(timeout=WAIT_MS)
    await expect(form.locator(".mselect")).to_have_class("mselect invalid")
    await expect(page.locator(".toast")).to_have_count(1)  # no callback answer: nothing was sent
    await page.screenshot(path=str(tmp_path / "components.png"), full_page=True)
    assert browser.errors == []
