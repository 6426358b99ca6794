"""ImageUploads against the sandbox over real HTTP: one upload per content, a bounded gate, single-flight."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest

from feishu_progress.errors import FeishuProgressError, ImageRefused
from feishu_progress.feishu import FeishuClient
from feishu_progress.images import ImageUploads
from feishu_progress.images.uploads import UploadAbandoned
from feishu_progress.sandbox import RunningSandbox, SandboxConfig
from tests.fakes import FakeClock
from tests.rigs import APP_ID, APP_SECRET

ARRIVAL_GUARD_SECONDS = 10.0  # waits on a condition, never on time; a bug fails instead of hanging


def png(tag: str) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + tag.encode()


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig(
        app_id=APP_ID, app_secret=APP_SECRET, app_per_second=math.inf, app_per_minute=math.inf
    )


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # time stands still: no rate window or token ever runs out mid-test


class GatedClient:
    """The real client, but every upload first waits at a gate the test opens."""

    def __init__(self, client: FeishuClient) -> None:
        self.client = client
        self.gate = asyncio.Event()
        self.calls = 0
        self.waiting = 0
        self._arrivals = asyncio.Condition()

    async def upload_image(self, data: bytes) -> str:
        self.calls += 1
        async with self._arrivals:
            self.waiting += 1
            self._arrivals.notify_all()
        await self.gate.wait()
        self.waiting -= 1
        return await self.client.upload_image(data)

    async def until_waiting(self, count: int) -> None:
        async with self._arrivals:
            await asyncio.wait_for(
                self._arrivals.wait_for(lambda: self.waiting >= count), ARRIVAL_GUARD_SECONDS
            )


async def test_each_content_is_uploaded_once_within_the_cache(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    uploads = ImageUploads(feishu, max_entries=2)
    first = await uploads.upload_image(png("cat"))
    assert await uploads.upload_image(png("cat")) == first
    second = await uploads.upload_image(png("dog"))
    assert second != first
    assert sandbox.state.requests["image"] == 2
    await uploads.upload_image(png("bird"))  # evicts "cat", the least recently used
    await uploads.upload_image(png("cat"))
    assert sandbox.state.requests["image"] == 4
    assert sandbox.state.images[first] == png("cat")


async def test_concurrent_uploads_of_the_same_bytes_share_one_upload(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    gated = GatedClient(feishu)
    uploads = ImageUploads(gated)
    racing = [asyncio.ensure_future(uploads.upload_image(png("same"))) for _ in range(3)]
    await gated.until_waiting(1)
    await FakeClock().settle()  # the other two get as far as they can
    assert gated.calls == 1
    gated.gate.set()
    keys = await asyncio.gather(*racing)
    assert len(set(keys)) == 1
    assert sandbox.state.requests["image"] == 1
    assert sandbox.state.images[keys[0]] == png("same")


async def test_at_most_concurrency_bodies_are_loaded_at_once(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    gated = GatedClient(feishu)
    uploads = ImageUploads(gated, concurrency=2)
    loaded: list[int] = []

    def loader(index: int) -> Callable[[], Awaitable[bytes]]:
        async def load() -> bytes:
            loaded.append(index)
            return png(f"image {index}")

        return load

    work = [asyncio.ensure_future(uploads.upload_from(loader(i))) for i in range(6)]
    await gated.until_waiting(2)
    await FakeClock().settle()
    assert loaded == [0, 1]  # the other four wait for a slot before reading anything
    gated.gate.set()
    keys = await asyncio.gather(*work)
    assert len(set(keys)) == 6
    assert sorted(loaded) == list(range(6))
    assert sandbox.state.requests["image"] == 6


async def test_a_failed_upload_fails_its_waiters_and_is_not_cached(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    gated = GatedClient(feishu)
    uploads = ImageUploads(gated)
    sandbox.state.faults.fail(1.0, status=500, endpoints=("image",))
    racing = [asyncio.ensure_future(uploads.upload_image(png("flaky"))) for _ in range(2)]
    await gated.until_waiting(1)
    await FakeClock().settle()
    gated.gate.set()
    results = await asyncio.gather(*racing, return_exceptions=True)
    assert all(isinstance(result, FeishuProgressError) for result in results)
    assert gated.calls == 1
    sandbox.state.faults.clear()
    image_key = await uploads.upload_image(png("flaky"))
    assert sandbox.state.images[image_key] == png("flaky")
    assert gated.calls == 2


async def test_a_cancelled_upload_releases_its_waiters(feishu: FeishuClient) -> None:
    gated = GatedClient(feishu)
    uploads = ImageUploads(gated)
    leader = asyncio.ensure_future(uploads.upload_image(png("abandoned")))
    await gated.until_waiting(1)
    follower = asyncio.ensure_future(uploads.upload_image(png("abandoned")))
    await FakeClock().settle()
    leader.cancel()
    with pytest.raises(UploadAbandoned):
        await asyncio.wait_for(follower, ARRIVAL_GUARD_SECONDS)
    assert leader.cancelled()


async def test_non_images_never_reach_feishu(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    uploads = ImageUploads(feishu)
    with pytest.raises(ImageRefused) as refused:
        await uploads.upload_image(b"FP_FEISHU__APP_SECRET=s3cret")
    assert refused.value.reason == "not_an_image"
    assert sandbox.state.requests["image"] == 0
