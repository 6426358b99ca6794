"""ImageKeys: a finished image tool call's sources become image_keys, over the sandbox and real files.

Local paths come from a root in tmp_path; URLs from an aiohttp server on 127.0.0.1 that the fetcher's
operator allowed (FP_IMAGES__ALLOWED_NETWORKS=127.0.0.1/32). Background work is awaited by draining
the tracked task set, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from feishu_progress.app import SERVICES
from feishu_progress.background import BackgroundTasks
from feishu_progress.config import (
    ImagesSettings,
    Settings,
)
from feishu_progress.domain import ToolCall
from feishu_progress.feishu import FeishuClient
from feishu_progress.images import ImageFetcher, ImageUploads, LocalImages
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.sandbox import RunningSandbox, SandboxConfig
from tests.conftest import sqlite_url
from tests.fakes import FakeClock
from tests.rigs import APP_ID, APP_SECRET, AUTH, Client, app_settings_for, eventually

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 10
DRAIN_GUARD_SECONDS = 60.0
MB = 1024 * 1024


def png(tag: str) -> bytes:
    return PNG + tag.encode()


def image_call(call_id: str, *items: dict[str, str], name: str = "generate_image") -> ToolCall:
    # Seed 000: an image result names a string image_url (the backend's own, often relative, URL).
    shaped = [{"image_url": f"/uploads/{n}.png", **item} for n, item in enumerate(items)]
    return ToolCall(
        call_id=call_id, name=name, result={"images": shaped, "model": "m", "size": "1x1"}, finished=True
    )


@dataclass
class Collected:
    batches: list[dict[str, str]] = field(default_factory=list)

    async def __call__(self, keys: dict[str, str]) -> None:
        self.batches.append(keys)

    @property
    def keys(self) -> dict[str, str]:
        return {source: key for batch in self.batches for source, key in batch.items()}


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig(
        app_id=APP_ID, app_secret=APP_SECRET, app_per_second=math.inf, app_per_minute=math.inf
    )


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # time stands still: no rate window or token ever runs out mid-test


@pytest.fixture
def root(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a", "b", "c"):
        (images / f"{name}.png").write_bytes(png(name))
    return images


@dataclass
class UrlServer:
    hits: Counter[str] = field(default_factory=Counter)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def url_server() -> AsyncIterator[UrlServer]:
    state = UrlServer()

    async def serve(request: web.Request) -> web.Response:
        state.hits[request.path] += 1
        return web.Response(body=png(request.path))

    app = web.Application()
    app.router.add_get("/{name}", serve)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    state.port = server.port
    try:
        yield state
    finally:
        await server.close()


@pytest.fixture
async def fetcher() -> AsyncIterator[ImageFetcher]:
    fetcher = ImageFetcher(ImagesSettings(allowed_networks=("127.0.0.1/32",)))
    await fetcher.open()
    try:
        yield fetcher
    finally:
        await fetcher.close()


@dataclass
class Rig:
    """The sandbox, a client talking to it, and the tracked background tasks uploads run in."""

    sandbox: RunningSandbox
    client: FeishuClient
    background: BackgroundTasks = field(default_factory=BackgroundTasks)

    def keys(self, root: Path | None = None, fetcher: ImageFetcher | None = None, **limits: int) -> ImageKeys:
        return ImageKeys(
            ImageUploads(self.client), self.background, local=LocalImages(root), fetcher=fetcher, **limits
        )

    async def settled(self) -> None:
        assert await self.background.drain(DRAIN_GUARD_SECONDS) == 0


@pytest.fixture
def rig(sandbox: RunningSandbox, feishu: FeishuClient) -> Rig:
    return Rig(sandbox, feishu)


async def test_a_path_beneath_the_root_gets_a_key(rig: Rig, root: Path) -> None:
    ready = Collected()
    rig.keys(root).collect(image_call("c1", {"image_path": "a.png"}), ready, 1)
    await rig.settled()
    assert rig.sandbox.state.images[ready.keys["a.png"]] == png("a")
    assert len(ready.batches) == 1


@pytest.fixture
def env_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The issue's .env: in the working directory, next to (not beneath) the root; even image-looking."""
    env = tmp_path / ".env"
    env.write_bytes(PNG + b"FP_FEISHU__APP_SECRET=s3cret")
    monkeypatch.chdir(tmp_path)
    return env


async def test_collect_names_what_is_on_its_way_and_settles_once_after_ready(rig: Rig, root: Path) -> None:
    """The card says "on its way" for exactly the refs being tried, until every one has a key or failed."""
    events: list[str] = []
    ready = Collected()

    async def on_ready(keys: dict[str, str]) -> None:
        events.append("ready")
        await ready(keys)

    call = image_call("c1", {"image_path": "a.png"}, {"image_path": "missing.png", "image_url": "/u/m.png"})
    uploading = rig.keys(root).collect(call, on_ready, 1, settled=lambda: events.append("settled"))
    assert uploading == {"a.png", "missing.png"}  # a relative URL is no source: never "on its way"
    await rig.settled()
    assert events == ["ready", "settled"] and set(ready.keys) == {"a.png"}
    nothing: list[str] = []
    again = rig.keys(None).collect(
        image_call("c2", {"image_path": "b.png"}), ready, 1, settled=lambda: nothing.append("x")
    )
    await rig.settled()
    assert again == {"b.png"} and nothing == ["x"]  # nothing found: settled all the same


async def test_refused_paths_get_no_key_and_are_never_logged(
    rig: Rig, root: Path, env_in_cwd: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = ["/etc/shadow", "/etc/passwd", ".env", "../.env", str(env_in_cwd), "missing.png"]
    ready = Collected()
    caplog.set_level(logging.DEBUG)
    rig.keys(root).collect(image_call("c1", *({"image_path": p} for p in refused)), ready, 1)
    await rig.settled()
    assert ready.batches == []
    assert rig.sandbox.state.requests["image"] == 0
    reasons = [record.__dict__.get("reason") for record in caplog.records if record.name.endswith("images")]
    assert sorted(reasons) == sorted(["outside_root"] * 4 + ["not_found"] * 2)  # ".env" is root/.env
    logged = " ".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    for path in refused:
        assert path not in logged


async def test_without_a_root_local_paths_get_no_key(rig: Rig, root: Path) -> None:
    ready = Collected()
    rig.keys(None).collect(image_call("c1", {"image_path": str(root / "a.png")}), ready, 1)
    await rig.settled()
    assert ready.batches == []
    assert rig.sandbox.state.requests["image"] == 0


async def test_an_http_url_is_fetched_and_keyed_by_the_url(
    rig: Rig, fetcher: ImageFetcher, url_server: UrlServer
) -> None:
    ready = Collected()
    url = url_server.url("/cat.png")
    rig.keys(None, fetcher).collect(image_call("c1", {"image_url": url}), ready, 1)
    await rig.settled()
    assert rig.sandbox.state.images[ready.keys[url]] == png("/cat.png")


async def test_a_refused_path_falls_back_to_the_url(
    rig: Rig, root: Path, fetcher: ImageFetcher, url_server: UrlServer
) -> None:
    ready = Collected()
    url = url_server.url("/fallback.png")
    call = image_call(
        "c1", {"image_path": "/etc/passwd", "image_url": url}, {"image_path": "b.png", "image_url": url}
    )
    rig.keys(root, fetcher).collect(call, ready, 1)
    await rig.settled()
    # The second item's path worked, so its URL (already tried by the first item anyway) was not needed.
    assert set(ready.keys) == {url, "b.png"}
    assert url_server.hits["/fallback.png"] == 1


async def test_handed_over_references_are_left_alone(rig: Rig, root: Path, fetcher: ImageFetcher) -> None:
    ready = Collected()
    call = image_call("c1", {"image_url": "fpimg:abc123"}, {"image_path": "fpimg:def456"})
    rig.keys(root, fetcher).collect(call, ready, 1)
    assert len(rig.background) == 0  # nothing to do: the upload endpoint resolves those
    assert ready.batches == []
    assert rig.sandbox.state.requests["image"] == 0


async def test_urls_that_are_not_http_are_not_sources(rig: Rig, fetcher: ImageFetcher) -> None:
    urls = ["/uploads/cat.png", "file:///etc/shadow", "oss://bucket/cat.png", "data:image/png;base64,AAAA"]
    rig.keys(None, fetcher).collect(image_call("c1", *({"image_url": url} for url in urls)), Collected(), 1)
    assert len(rig.background) == 0


async def test_urls_without_a_fetcher_get_no_key(
    rig: Rig, url_server: UrlServer, caplog: pytest.LogCaptureFixture
) -> None:
    ready = Collected()
    rig.keys(None).collect(image_call("c1", {"image_url": url_server.url("/x.png")}), ready, 1)
    await rig.settled()
    assert ready.batches == []
    assert url_server.hits["/x.png"] == 0
    assert [record.__dict__.get("reason") for record in caplog.records] == ["fetch_disabled"]


async def test_each_source_is_tried_once_per_task(
    rig: Rig, fetcher: ImageFetcher, url_server: UrlServer
) -> None:
    images = rig.keys(None, fetcher)
    url = url_server.url("/once.png")
    first, again, other_task = Collected(), Collected(), Collected()
    images.collect(image_call("c1", {"image_url": url}), first, 1)
    await rig.settled()
    images.collect(image_call("c2", {"image_url": url}), again, 1)
    assert len(rig.background) == 0
    images.collect(image_call("c3", {"image_url": url}), other_task, 2)
    await rig.settled()
    assert url_server.hits["/once.png"] == 2  # once for task 1, once for task 2
    assert rig.sandbox.state.requests["image"] == 1  # same bytes: one upload
    assert first.keys == other_task.keys
    assert again.batches == []


async def test_at_most_nine_images_per_call(rig: Rig, fetcher: ImageFetcher, url_server: UrlServer) -> None:
    ready = Collected()
    call = image_call("c1", *({"image_url": url_server.url(f"/{i}.png")} for i in range(12)))
    rig.keys(None, fetcher).collect(call, ready, 1)
    await rig.settled()
    assert sorted(ready.keys) == sorted(url_server.url(f"/{i}.png") for i in range(9))
    assert sum(url_server.hits.values()) == 9


async def test_the_per_task_cap_stops_further_images(
    rig: Rig, fetcher: ImageFetcher, url_server: UrlServer
) -> None:
    images = rig.keys(None, fetcher, max_per_task=3)
    ready = Collected()
    for call_id in ("c1", "c2"):
        items = ({"image_url": url_server.url(f"/{call_id}-{i}.png")} for i in range(2))
        images.collect(image_call(call_id, *items), ready, 1)
    await rig.settled()
    assert sorted(url_server.hits) == ["/c1-0.png", "/c1-1.png", "/c2-0.png"]
    assert len(ready.keys) == 3
    images.collect(image_call("c3", {"image_url": url_server.url("/other-task.png")}), ready, 2)
    await rig.settled()
    assert url_server.hits["/other-task.png"] == 1  # the cap is per task


async def test_only_finished_image_tools_are_looked_at(rig: Rig, root: Path) -> None:
    images = rig.keys(root)
    item = {"image_path": "a.png"}
    images.collect(image_call("c1", item, name="web_search"), Collected(), 1)
    unfinished = ToolCall(call_id="c2", name="edit_image", result={"images": [item]}, finished=False)
    images.collect(unfinished, Collected(), 1)
    images.collect(image_call("c3", {"nothing": "here"}), Collected(), 1)
    ImageKeys(None, rig.background, local=LocalImages(root)).collect(image_call("c4", item), Collected(), 1)
    assert len(rig.background) == 0


# --- bounded memory ------------------------------------------------------------------------------


@pytest.fixture
def big_copies(tmp_path: Path) -> list[str]:
    """Nine copies of one 10 MB image under tmp_path/big."""
    root = tmp_path / "big"
    root.mkdir()
    body = PNG + bytes(range(256)) * (10 * MB // 256 - 1)
    names = [f"copy-{i}.png" for i in range(9)]
    for name in names:
        (root / name).write_bytes(body)
    return names


@pytest.mark.slow  # 90 reads of 10 MB
async def test_many_results_of_big_copies_stay_within_the_semaphore_and_upload_once(
    rig: Rig, tmp_path: Path, big_copies: list[str]
) -> None:
    concurrency = 2
    uploads = ImageUploads(rig.client, concurrency=concurrency)
    images = ImageKeys(uploads, rig.background, local=LocalImages(tmp_path / "big"))
    ready = Collected()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        # 200 results over 10 tasks: each task reads its 9 copies once (90 reads of 10 MB in all).
        for n in range(200):
            call = image_call(f"call-{n}", *({"image_path": name} for name in big_copies))
            images.collect(call, ready, n % 10)
        await rig.settled()
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert rig.sandbox.state.requests["image"] == 1
    assert len(ready.batches) == 10 and all(len(batch) == 9 for batch in ready.batches)
    # At most `concurrency` bodies being read/uploaded, plus the sandbox's own copies of the one upload
    # (measured: ~41 MB at concurrency 2; ~640 MB when the gate is 64 wide).
    assert peak < (concurrency + 3) * 10 * MB, f"peak {peak / MB:.1f} MB"


# --- the app's wiring ----------------------------------------------------------------------------


@pytest.fixture
def app_settings(sandbox: RunningSandbox, root: Path, tmp_path: Path) -> Settings:
    return app_settings_for(sandbox, sqlite_url(tmp_path / "app.db"), images=ImagesSettings(root=root))


async def _card_shows(sandbox: RunningSandbox, message_id: str, text: str) -> str:
    """The message's card once its JSON holds ``text`` (the scheduler delivers within a second or two)."""
    shown: str = await eventually(
        lambda: json.dumps(sandbox.state.messages[message_id].card, ensure_ascii=False),
        until=lambda shown: text in shown,
        timeout=DRAIN_GUARD_SECONDS,
    )
    return shown


async def test_an_image_on_its_way_says_so_on_the_delivered_card(
    sandbox: RunningSandbox, client: Client
) -> None:
    """Seed 000 D5 is for an image that cannot be reached; while its upload runs the card says 图片上传中."""
    task = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1", "title": "t"}
    created = await (await client.post("/v1/tasks", json=task, headers=AUTH)).json()
    sandbox.state.faults.slow(1500, endpoints=("image",))  # the upload takes a while
    result = {"images": [{"image_url": "/u/a.png", "image_path": "a.png", "size_bytes": 2048}]}
    events = [
        {"type": "tool_started", "call_id": "img-1", "name": "generate_image", "args": {"prompt": "a"}},
        {"type": "tool_finished", "call_id": "img-1", "result": result},
    ]
    path = f"/v1/tasks/{created['session_id']}/events"
    assert (await client.post(path, json={"events": events}, headers=AUTH)).status == 202
    during = await _card_shows(sandbox, created["message_id"], "图片上传中")
    assert "图片不可达" not in during
    after = await _card_shows(sandbox, created["message_id"], '"img_key"')
    assert "图片上传中" not in after and "图片不可达" not in after


async def test_the_app_uploads_images_from_its_root_only(sandbox: RunningSandbox, client: Client) -> None:
    auth = AUTH
    task = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1", "title": "t"}
    created = await client.post("/v1/tasks", json=task, headers=auth)
    session_id = (await created.json())["session_id"]
    result = {
        "images": [
            {"image_url": "/u/a.png", "image_path": "a.png"},
            {"image_url": "/u/p", "image_path": "/etc/passwd"},
        ]
    }
    events = [
        {"type": "tool_started", "call_id": "img-1", "name": "generate_image", "args": {"prompt": "a"}},
        {"type": "tool_finished", "call_id": "img-1", "result": result},
    ]
    response = await client.post(f"/v1/tasks/{session_id}/events", json={"events": events}, headers=auth)
    assert response.status == 202, await response.text()
    uploading = [t for t in asyncio.all_tasks() if t.get_name() == "images-img-1"]
    await asyncio.wait_for(asyncio.gather(*uploading), DRAIN_GUARD_SECONDS)
    state = (await client.app[SERVICES].service.require(session_id)).state
    image_keys = state.image_keys
    assert list(image_keys) == ["a.png"]
    assert sandbox.state.images[image_keys["a.png"]] == png("a")
    # Settled: nothing is still "on its way" on the card; the refused path is simply unreachable.
    assert not state.uploading_images
    assert state.card_state().panels.image_keys == {"a.png": image_keys["a.png"]}
