"""Send, reply and image upload survive a blip: bounded retries with jitter, the same ``uuid`` every time.

Over real HTTP to the sandbox (sometimes through the TCP proxy); the client's backoff runs on an
``InstantClock``, so the waits cost no wall time and are checked exactly.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import SecretStr

from feishu_progress.config import FeishuSettings
from feishu_progress.errors import FeishuAPIError, FeishuTransportError
from feishu_progress.feishu import FeishuClient
from feishu_progress.feishu.retry import FeishuRetryPolicy
from feishu_progress.sandbox import RunningSandbox
from tests.conftest import ProxyFactory
from tests.fakes import FakeClock, InstantClock
from tests.rigs import APP_ID, APP_SECRET

pytestmark = pytest.mark.faults

POLICY = FeishuRetryPolicy()
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def card(text: str = "hello") -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": text}]},
    }


def settings(base_url: str, timeout: float = 5.0) -> FeishuSettings:
    return FeishuSettings(
        base_url=base_url, app_id=APP_ID, app_secret=SecretStr(APP_SECRET), timeout_seconds=timeout
    )


@pytest.fixture
def sandbox_clock() -> Callable[[], float]:
    return FakeClock().monotonic  # sandbox time stands still: a 429 storm lasts until the test says


@pytest.fixture
def clock() -> InstantClock:
    return InstantClock()  # the client's backoffs: recorded, and no wall time spent


@pytest.fixture
async def seeded_feishu(feishu_settings: FeishuSettings, clock: InstantClock) -> AsyncIterator[FeishuClient]:
    """The rigs' ``feishu`` on the InstantClock, its backoff jitter seeded: a run repeats exactly."""
    async with FeishuClient(feishu_settings, clock=clock, rng=random.Random(3)) as opened:
        yield opened


def assert_backoffs(sleeps: list[float]) -> None:
    """Each wait is the policy's jittered, doubling backoff for its attempt: between half and all of it."""
    for attempt, waited in enumerate(sleeps, start=1):
        ceiling = min(POLICY.max_seconds, POLICY.base_seconds * 2 ** (attempt - 1))
        assert ceiling / 2 <= waited <= ceiling, (attempt, waited)


async def test_two_500s_on_send_cost_two_backoffs_and_send_one_message(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox, clock: InstantClock
) -> None:
    sandbox.state.faults.fail_next(2, status=500, endpoints=("send",))
    message_id = await seeded_feishu.send_card("oc_1", "chat_id", card(), "fp-task-1")
    assert list(sandbox.state.messages) == [message_id]
    assert sandbox.state.requests["send"] == 3
    assert len(clock.sleeps) == 2
    assert_backoffs(clock.sleeps)


async def test_a_send_whose_answers_were_lost_finds_its_first_message_by_uuid(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    sandbox.state.faults.lose_answers(2, endpoints=("send",))
    message_id = await seeded_feishu.send_card("oc_1", "chat_id", card(), "fp-task-2")
    assert sandbox.state.requests["send"] == 3
    assert list(sandbox.state.messages) == [message_id]  # Feishu made it on the first try


async def test_without_a_uuid_a_lost_answer_would_send_a_second_card(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    # The control for the test above: the sandbox really carries out a request whose answer it loses.
    sandbox.state.faults.lose_answers(1, endpoints=("send",))
    await seeded_feishu.send_card("oc_1", "chat_id", card(), "")
    assert len(sandbox.state.messages) == 2


async def test_a_reply_whose_answer_was_lost_is_one_reply(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    parent = await seeded_feishu.send_card("oc_1", "chat_id", card("question"), "fp-parent")
    sandbox.state.faults.lose_answers(1, endpoints=("reply",))
    sandbox.state.faults.fail_next(1, endpoints=("reply",))
    reply_id = await seeded_feishu.reply_card(parent, card("answer"), "fp-reply")
    assert sandbox.state.requests["reply"] == 3
    replies = [m for m in sandbox.state.messages.values() if m.parent_id == parent]
    assert [m.message_id for m in replies] == [reply_id]


async def test_two_500s_on_upload_store_one_image(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox, clock: InstantClock
) -> None:
    sandbox.state.faults.fail_next(2, status=502, endpoints=("image",))
    image_key = await seeded_feishu.upload_image(PNG)
    assert sandbox.state.images == {image_key: PNG}
    assert sandbox.state.requests["image"] == 3
    assert_backoffs(clock.sleeps)


async def test_an_outage_is_tried_a_bounded_number_of_times(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox, clock: InstantClock
) -> None:
    sandbox.state.faults.outage(endpoints=("send",))
    with pytest.raises(FeishuAPIError) as failed:
        await seeded_feishu.send_card("oc_1", "chat_id", card(), "fp-task-3")
    assert failed.value.http_status == 503
    assert sandbox.state.requests["send"] == POLICY.attempts
    assert len(clock.sleeps) == POLICY.attempts - 1
    assert_backoffs(clock.sleeps)
    assert sandbox.state.messages == {}


async def test_a_refused_request_is_not_tried_again(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox, clock: InstantClock
) -> None:
    with pytest.raises(FeishuAPIError) as refused:
        await seeded_feishu.send_card("oc_1", "no_such_type", card(), "fp-task-4")
    assert refused.value.code == 99992402
    assert sandbox.state.requests["send"] == 1
    assert clock.sleeps == []


async def test_a_rate_limit_waits_what_feishu_says_capped(
    seeded_feishu: FeishuClient, sandbox: RunningSandbox, clock: InstantClock
) -> None:
    sandbox.state.faults.fail_next(1, status=429, endpoints=("send",))
    await seeded_feishu.send_card("oc_1", "chat_id", card(), "fp-task-5")
    assert clock.sleeps == [1.0]  # a 429 without a reset header: the gateway's usual second
    clock.sleeps.clear()
    sandbox.state.faults.storm_429(30.0, endpoints=("send",))  # header says 30 s; sandbox time stands still
    with pytest.raises(FeishuAPIError):
        await seeded_feishu.send_card("oc_1", "chat_id", card(), "fp-task-6")
    assert clock.sleeps == [POLICY.max_seconds] * (POLICY.attempts - 1)


async def test_connections_reset_by_a_cut_link_are_retried_until_it_heals(
    sandbox: RunningSandbox, tcp_proxy: ProxyFactory, clock: InstantClock
) -> None:
    proxy = await tcp_proxy("127.0.0.1", int(sandbox.base_url.rsplit(":", 1)[1]))
    proxy.cut()
    clock.on_sleep = lambda _seconds: proxy.heal()  # the link comes back while the client waits
    async with FeishuClient(settings(f"http://127.0.0.1:{proxy.port}"), clock=clock) as client:
        message_id = await client.send_card("oc_1", "chat_id", card(), "fp-task-7")
    assert proxy.refused == 1
    assert len(clock.sleeps) == 1
    assert list(sandbox.state.messages) == [message_id]


async def test_a_link_that_stays_cut_fails_as_a_transport_error_after_every_attempt(
    sandbox: RunningSandbox, tcp_proxy: ProxyFactory, clock: InstantClock
) -> None:
    proxy = await tcp_proxy("127.0.0.1", int(sandbox.base_url.rsplit(":", 1)[1]))
    proxy.cut()
    async with FeishuClient(settings(f"http://127.0.0.1:{proxy.port}"), clock=clock) as client:
        with pytest.raises(FeishuTransportError):
            await client.upload_image(PNG)
    assert proxy.refused == POLICY.attempts
    assert sandbox.state.images == {}


async def test_a_blackholed_request_times_out_and_is_retried(
    sandbox: RunningSandbox, tcp_proxy: ProxyFactory, clock: InstantClock
) -> None:
    proxy = await tcp_proxy("127.0.0.1", int(sandbox.base_url.rsplit(":", 1)[1]))
    proxy.blackhole()
    clock.on_sleep = lambda _seconds: proxy.heal()
    quick = settings(f"http://127.0.0.1:{proxy.port}", timeout=0.3)
    async with FeishuClient(quick, clock=clock) as client:
        message_id = await client.send_card("oc_1", "chat_id", card(), "fp-task-8")
    assert proxy.swallowed > 0
    assert list(sandbox.state.messages) == [message_id]
