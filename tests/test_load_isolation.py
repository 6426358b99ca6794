"""Issue 26 items 4, 5 and 7: a flood of large bodies waits its turn instead of starving everything else.

The app runs in-process (SQLite, the in-process sandbox). A large body is held "in progress" by sending
it slowly over a raw socket: while it holds the one slot, another large batch waits and then gets 429
with Retry-After, and small batches and clicks go through at once.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import (
    MAX_IMAGE_BYTES,
    AdminSettings,
    ApiSettings,
    FeishuSettings,
    HttpSettings,
    ImagesSettings,
    RateSettings,
    Settings,
    TaskSettings,
)
from feishu_progress.runtime.state import MAX_IMAGE_KEYS
from feishu_progress.sandbox import preview
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.web import load
from feishu_progress.web.http import HttpError, parse_json
from feishu_progress.web.load import HeavyGate

TOKEN = "load-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1"}
LARGE = json.dumps({"events": [{"type": "content", "text": "x" * 15_000} for _ in range(30)]}).encode()


def _settings(tmp_path: Path, **http: Any) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'load.db'}",
        http=HttpSettings(host="127.0.0.1", port=0, **http),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=TOKEN),
    )


async def _slow_large_body(client: TestClient[Any, Any], path: str) -> asyncio.StreamWriter:
    """Starts a large batch and sends only its first bytes: it holds the large-body slot."""
    _, writer = await asyncio.open_connection(client.host, client.port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(LARGE)}\r\n\r\n"
    ).encode()
    writer.write(head + LARGE[:1000])
    await writer.drain()
    return writer


async def test_large_batches_wait_their_turn_and_small_ones_do_not(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = _settings(tmp_path, large_body_wait_seconds=0.5)
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    path = f"/v1/tasks/{session_id}/events"
    holder = await _slow_large_body(client, path)
    await asyncio.sleep(0.1)  # the server is reading it
    try:
        started = time.monotonic()
        small = await client.post(path, json={"events": [{"type": "content", "text": "小"}]}, headers=AUTH)
        assert small.status == 202 and time.monotonic() - started < 0.4
        waited = await client.post(path, data=LARGE, headers=AUTH | {"Content-Type": "application/json"})
        assert waited.status == 429
        assert waited.headers["Retry-After"] == "1"
        assert (await waited.json())["error"] == "too_busy"
    finally:
        holder.close()
    await asyncio.sleep(0.1)  # the abandoned body gives its slot back
    again = await client.post(path, data=LARGE, headers=AUTH | {"Content-Type": "application/json"})
    assert again.status == 202


async def test_while_a_click_is_answered_a_large_body_waits_at_its_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = HeavyGate()
    with gate.urgent():
        step = asyncio.create_task(gate.give_way())
        await asyncio.sleep(0.05)
        assert not step.done(), "the large body went on while the click was answered"
    await asyncio.wait_for(step, 1)
    monkeypatch.setattr(load, "GIVE_WAY_SECONDS", 0.05)
    with gate.urgent():  # a click that takes long slows a large body down, it never stops it
        await asyncio.wait_for(gate.give_way(), 1)
    await asyncio.wait_for(gate.give_way(), 1)  # no click: at once


@pytest.mark.parametrize(
    "raw",
    [
        b'{"events": [{"type": "content", "text": "\\ud83d\\ude00 ok"}]}',
        b'{"a": 1e400, "b": -0, "c": 123456789012345678901234567890, "a": 2}',
        '{"t": "文本"}'.encode("utf-16"),  # not UTF-8: json.loads still takes it
        b"[" * 100 + b"]" * 100,  # within the parser's own limit, past ours
        b"[" * 300 + b"]" * 300,  # past the parser's own limit too
        b'{"t": "\\ud800"}',  # a lone surrogate
        b'{"t": "x"',
        b"\xff\xfe\x00",
    ],
)
def test_the_fast_json_parser_answers_as_json_loads_did(raw: bytes) -> None:
    """parse_json takes pydantic-core's parser first (half the CPU on a large batch): same answers."""
    try:
        expected: Any = ("ok", json.loads(raw))
        if json.dumps(expected[1]).count("[") > 64:
            expected = ("error", 422)
        elif "\\ud800" in raw.decode("utf-8", "replace"):
            expected = ("error", 400)
    except ValueError:
        expected = ("error", 400)
    try:
        got: Any = ("ok", parse_json(raw))
    except HttpError as exc:
        got = ("error", exc.status)
    assert got == expected


# -- item 5: image uploads take their slot before their body, and cost Feishu nothing when refused -------


def _png(tag: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + tag.to_bytes(4, "big") + b"\x00" * 64


def _form(data: bytes) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("image", data, filename="x.png", content_type="image/png")
    return form


async def _slow_upload(client: TestClient[Any, Any], path: str) -> asyncio.StreamWriter:
    """An upload whose body trickles in: it holds an upload slot while it is read."""
    _, writer = await asyncio.open_connection(client.host, client.port)
    part = b"--b\r\nContent-Disposition: form-data; name=image; filename=x.png\r\n\r\n" + _png(0)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    writer.write(head + part)
    await writer.drain()
    return writer


async def test_an_upload_waits_for_a_slot_before_its_body_is_read_then_429(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = _settings(tmp_path).model_copy(update={"images": ImagesSettings(concurrency=1)})
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    path = f"/v1/tasks/{session_id}/images"
    holder = await _slow_upload(client, path)
    await asyncio.sleep(0.1)
    try:
        busy = await client.post(path, data=_form(_png(1)), headers=AUTH)
        assert busy.status == 429 and busy.headers["Retry-After"] == "1"
        assert (await busy.json())["error"] == "too_busy"
    finally:
        holder.close()
    await asyncio.sleep(0.1)
    assert (await client.post(path, data=_form(_png(2)), headers=AUTH)).status == 201


async def test_a_full_or_finished_task_refuses_an_image_before_feishu_sees_it(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(_settings(tmp_path), registry=CollectorRegistry())
    )
    sandbox = client.app[SERVICES].sandbox
    assert sandbox is not None
    session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    path = f"/v1/tasks/{session_id}/images"
    for tag in range(MAX_IMAGE_KEYS):
        assert (await client.post(path, data=_form(_png(tag)), headers=AUTH)).status == 201
    uploads = len(sandbox.state.images)
    full = await client.post(path, data=_form(_png(10_000)), headers=AUTH)
    assert full.status == 422 and (await full.json())["error"] == "too_many_images"
    assert (await client.post(path, data=_form(_png(5)), headers=AUTH)).status == 201  # one it holds
    finished = {"events": [{"type": "finished", "status": "COMPLETED"}]}
    assert (await client.post(f"/v1/tasks/{session_id}/events", json=finished, headers=AUTH)).status == 202
    late = await client.post(path, data=_form(_png(20_000)), headers=AUTH)
    assert late.status == 409
    assert len(sandbox.state.images) == uploads, "a refused image was uploaded to Feishu"


# -- item 5 (tail): image URLs have fetch slots of their own, a fair share per task, and give up early ----


@dataclass
class SlowImages:
    """``/never/*`` answers nothing till the end; ``/trickle/*`` its head, then 50 B/s; ``/fast/*`` a PNG."""

    release: asyncio.Event = field(default_factory=asyncio.Event)
    hits: Counter[str] = field(default_factory=Counter)
    base: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        self.hits[kind] += 1
        if kind == "fast":
            return web.Response(body=_png(len(request.path)), content_type="image/png")
        if kind == "never":
            await self.release.wait()
            return web.Response(status=503)
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        await response.prepare(request)
        await response.write(_png(0)[:8])
        while not self.release.is_set():
            await response.write(b"x")
            await asyncio.sleep(0.02)
        return response


@pytest.fixture
async def slow_images() -> AsyncIterator[SlowImages]:
    state = SlowImages()
    app = web.Application()
    app.router.add_get("/{kind}/{name}", state.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    state.base = f"http://127.0.0.1:{server.port}"
    try:
        yield state
    finally:
        state.release.set()
        await server.close()


def _image_settings(tmp_path: Path, **images: Any) -> Settings:
    root = tmp_path / "images"
    root.mkdir()
    (root / "local.png").write_bytes(_png(7))
    fetch = ImagesSettings(root=root, allowed_networks=("127.0.0.1/32",), **images)
    return _settings(tmp_path).model_copy(update={"images": fetch})


def _image_result(call_id: str, images: list[dict[str, str]]) -> dict[str, Any]:
    # Seed 000: the first item names a string image_url (a relative one is the backend's own: not fetched).
    result = {"images": [{"image_url": "/uploads/x.png", **image} for image in images]}
    return {
        "events": [
            {"type": "tool_started", "call_id": call_id, "name": "generate_image", "args": {"prompt": "p"}},
            {"type": "tool_finished", "call_id": call_id, "result": result},
        ]
    }


async def _new_task_with_images(client: TestClient[Any, Any], calls: dict[str, list[dict[str, str]]]) -> int:
    session_id: int = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    for call_id, images in calls.items():
        path = f"/v1/tasks/{session_id}/events"
        answer = await client.post(path, json=_image_result(call_id, images), headers=AUTH)
        assert answer.status == 202, await answer.text()
    return session_id


async def _card_once(client: TestClient[Any, Any], session_id: int, done: Callable[[str], bool]) -> str:
    """The task's current card (as JSON text) once ``done`` holds for it; 20 s at most."""
    async with asyncio.timeout(20):
        while True:
            view = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
            card = json.dumps(view["card"], ensure_ascii=False)
            if done(card):
                return card
            await asyncio.sleep(0.05)


async def test_one_tasks_slow_urls_do_not_delay_another_tasks_images(
    tmp_path: Path, aiohttp_client: Any, slow_images: SlowImages
) -> None:
    """Issue 26: 18 never-answering URLs of one task delayed another task's local image 39 s."""
    settings = _image_settings(tmp_path, fetch_first_byte_seconds=60, fetch_per_task=2)
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    never = [{"image_url": f"{slow_images.base}/never/{n}.png"} for n in range(18)]
    slow = await _new_task_with_images(client, {"slow-1": never[:9], "slow-2": never[9:]})
    other = await _new_task_with_images(
        client, {"mine": [{"image_path": "local.png"}, {"image_url": f"{slow_images.base}/fast/b.png"}]}
    )
    shown = await _card_once(client, other, lambda card: card.count('"img_key"') == 2)
    assert "图片上传中" not in shown
    # Meanwhile the slow task is still waiting, on its share of the fetch slots only.
    assert "图片上传中" in await _card_once(client, slow, lambda card: True)
    assert slow_images.hits["never"] == 2


async def test_a_url_that_stalls_or_trickles_gives_up_and_the_card_says_unreachable(
    tmp_path: Path, aiohttp_client: Any, slow_images: SlowImages, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _image_settings(
        tmp_path, fetch_first_byte_seconds=1.0, fetch_min_bytes_per_second=1000, fetch_timeout_seconds=60
    )
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    images = [
        {"image_url": f"{slow_images.base}/never/stalled.png"},
        {"image_url": f"{slow_images.base}/trickle/trickled.png"},
    ]
    started = time.monotonic()
    session_id = await _new_task_with_images(client, {"slow": images})
    card = await _card_once(client, session_id, lambda card: "图片上传中" not in card)
    assert time.monotonic() - started < 30, "the fetches ran to the total timeout"
    assert "图片不可达 · stalled.png" in card and "图片不可达 · trickled.png" in card
    reasons = {record.__dict__.get("reason") for record in caplog.records}
    assert {"first_byte_timeout", "too_slow"} <= reasons, reasons


# -- item 7: caps with a clear answer --------------------------------------------------------------------


async def test_past_max_live_tasks_a_create_is_a_503_with_retry_after(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = _settings(tmp_path).model_copy(update={"task": TaskSettings(max_live=2)})
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    for _ in range(2):
        assert (await client.post("/v1/tasks", json=TASK, headers=AUTH)).status == 201
    refused = await client.post("/v1/tasks", json=TASK, headers=AUTH)
    assert refused.status == 503 and refused.headers["Retry-After"] == "5"
    assert "FP_TASK__MAX_LIVE" in (await refused.json())["message"]


async def test_parts_besides_the_image_count_against_the_cap(tmp_path: Path, aiohttp_client: Any) -> None:
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(_settings(tmp_path), registry=CollectorRegistry())
    )
    session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    form = aiohttp.FormData()
    form.add_field(
        "junk",
        io.BytesIO(b"j" * (MAX_IMAGE_BYTES + 100_000)),  # the image alone is within its cap
        filename="j.bin",
        content_type="application/octet-stream",
    )
    form.add_field("image", _png(1), filename="x.png", content_type="image/png")
    answer = await client.post(f"/v1/tasks/{session_id}/images", data=form, headers=AUTH)
    assert answer.status == 413
    many = aiohttp.FormData()
    for index in range(20):
        many.add_field(f"p{index}", "x")
    many.add_field("image", _png(2), filename="x.png", content_type="image/png")
    assert (await client.post(f"/v1/tasks/{session_id}/images", data=many, headers=AUTH)).status == 422


async def test_preview_streams_past_the_cap_are_refused(
    tmp_path: Path, aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preview, "MAX_STREAMS", 2)
    client: TestClient[Any, Any] = await aiohttp_client(
        create_app(_settings(tmp_path), registry=CollectorRegistry())
    )
    open_streams = [await client.get("/sandbox/api/events", headers=AUTH) for _ in range(2)]
    try:
        assert [stream.status for stream in open_streams] == [200, 200]
        refused = await client.get("/sandbox/api/events", headers=AUTH)
        assert refused.status == 503 and "Retry-After" in refused.headers
    finally:
        for stream in open_streams:
            stream.close()


async def test_uploads_are_charged_to_the_upload_apis_budget(tmp_path: Path, aiohttp_client: Any) -> None:
    config = SandboxConfig(app_id="cli_img", app_secret="img-secret", app_per_second=5)
    async with run_sandbox(config) as sandbox:
        limited: list[float] = []
        refuse = sandbox.state.gateway_limited

        def counted(seconds: float) -> Any:
            limited.append(seconds)
            return refuse(seconds)

        sandbox.state.gateway_limited = counted  # type: ignore[method-assign,assignment]
        settings = _settings(tmp_path).model_copy(
            update={
                "feishu": FeishuSettings(
                    base_url=sandbox.base_url,
                    app_id="cli_img",
                    app_secret="img-secret",
                    verification_token="v",
                ),
                "rate": RateSettings(app_per_second=5),
                "images": ImagesSettings(concurrency=8),
            }
        )
        client: TestClient[Any, Any] = await aiohttp_client(
            create_app(settings, registry=CollectorRegistry())
        )
        session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
        path = f"/v1/tasks/{session_id}/images"
        answers = await asyncio.gather(
            *(client.post(path, data=_form(_png(100 + tag)), headers=AUTH) for tag in range(12))
        )
        assert [answer.status for answer in answers] == [201] * 12
        assert limited == [], "an upload went past the app's image budget and drew a 429"
        await client.close()
