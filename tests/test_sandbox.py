"""The sandbox enforces Feishu's documented limits with the real codes (through the real client)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from feishu_progress.config import FeishuSettings
from feishu_progress.errors import FeishuAPIError, FeishuTransportError
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.errors import classify
from feishu_progress.ports import OutcomeKind
from feishu_progress.sandbox import RunningSandbox, SandboxConfig, SandboxState
from feishu_progress.sandbox.state import SlidingWindow
from tests.fakes import FakeClock


def card(text: str = "hello", *, elements: int = 1) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": f"{text} {i}"} for i in range(elements)]},
    }


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig()  # any app: the limits are what these tests read


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # windows, TTLs and the update window move only when a test advances


@pytest.fixture
def feishu_clock(clock: FakeClock) -> FakeClock:
    return clock  # the client's token renewal on the same fake time as the sandbox


async def send(feishu: FeishuClient, uuid: str = "") -> str:
    return await feishu.send_card("ou_user", "open_id", card(), uuid)


async def api_error(coro: Any) -> FeishuAPIError:
    with pytest.raises(FeishuAPIError) as caught:
        await coro
    return caught.value


# --- per-message and app limits ----------------------------------------------------------------


async def test_sixth_patch_within_a_second_is_230020(feishu: FeishuClient, clock: FakeClock) -> None:
    message_id = await send(feishu)
    for i in range(5):
        await feishu.patch_card(message_id, card(f"v{i}"))
    error = await api_error(feishu.patch_card(message_id, card("v5")))
    assert error.code == 230020
    assert classify(error).kind is OutcomeKind.RETRY_MESSAGE
    await clock.advance(1.0)
    await feishu.patch_card(message_id, card("v6"))


async def test_sliding_window_counts_the_last_second_only(feishu: FeishuClient, clock: FakeClock) -> None:
    message_id = await send(feishu)
    for i in range(5):
        await feishu.patch_card(message_id, card(f"v{i}"))
        await clock.advance(0.15)
    # 0.75 s passed: the first PATCH is still inside the window.
    assert (await api_error(feishu.patch_card(message_id, card("x")))).code == 230020
    await clock.advance(0.3)
    await feishu.patch_card(message_id, card("y"))


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(app_per_second=3, per_message_qps=math.inf)])
async def test_app_per_second_budget_is_429_with_reset(feishu: FeishuClient) -> None:
    message_id = await send(feishu)
    for i in range(3):
        await feishu.patch_card(message_id, card(f"v{i}"))
    error = await api_error(feishu.patch_card(message_id, card("over")))
    assert (error.code, error.http_status, error.retry_after) == (99991400, 429, 1.0)
    outcome = classify(error)
    assert (outcome.kind, outcome.retry_after) == (OutcomeKind.PAUSE_APP, 1.0)


@pytest.mark.parametrize(
    "sandbox_config", [SandboxConfig(app_per_second=math.inf, app_per_minute=4, per_message_qps=math.inf)]
)
async def test_app_per_minute_budget_resets_when_the_oldest_call_leaves(
    feishu: FeishuClient, clock: FakeClock
) -> None:
    message_id = await send(feishu)
    for i in range(4):
        await feishu.patch_card(message_id, card(f"v{i}"))
        await clock.advance(10)
    error = await api_error(feishu.patch_card(message_id, card("over")))
    assert error.retry_after == 20.0  # the first PATCH was 40 s ago
    await clock.advance(20)
    await feishu.patch_card(message_id, card("after"))


# --- cards refused ---------------------------------------------------------------------------


async def test_card_over_30kb_is_230025(feishu: FeishuClient) -> None:
    message_id = await send(feishu)
    error = await api_error(feishu.patch_card(message_id, card("x" * 31 * 1024)))
    assert error.code == 230025
    assert classify(error).kind is OutcomeKind.DEGRADE


async def test_card_over_200_elements_is_300305(feishu: FeishuClient) -> None:
    message_id = await send(feishu)
    assert (await api_error(feishu.patch_card(message_id, card(elements=201)))).code == 300305
    await feishu.patch_card(message_id, card(elements=200))


@pytest.mark.parametrize(
    ("broken", "needle"),
    [
        (
            {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": [{"tag": "note"}]}},
            "note",
        ),
        ({"schema": "2.0", "config": {}, "body": {"elements": []}}, "update_multi"),
        ({"config": {"update_multi": True}, "elements": []}, "2.0"),
    ],
)
async def test_invalid_card_is_230099_naming_the_problem(
    feishu: FeishuClient, broken: dict[str, Any], needle: str
) -> None:
    message_id = await send(feishu)
    error = await api_error(feishu.patch_card(message_id, broken))
    assert error.code == 230099
    assert needle in error.msg


async def test_invalid_card_is_refused_on_send_too(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    broken = {"schema": "2.0", "body": {"elements": []}}
    assert (await api_error(feishu.send_card("ou_x", "open_id", broken, ""))).code == 230099
    assert sandbox.state.messages == {}


# --- message state ---------------------------------------------------------------------------


async def test_update_window_is_14_days(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    message_id = await send(feishu)
    sandbox.state.age_message(message_id, 13.9)
    await feishu.patch_card(message_id, card("still fine"))
    sandbox.state.age_message(message_id, 0.2)
    error = await api_error(feishu.patch_card(message_id, card("too late")))
    assert error.code == 230031
    assert classify(error).kind is OutcomeKind.STOP


@pytest.mark.parametrize(("action", "code"), [("recall", 230011), ("delete", 230110)])
async def test_recalled_and_deleted_messages_refuse_patches(
    feishu: FeishuClient, sandbox: RunningSandbox, action: str, code: int
) -> None:
    message_id = await send(feishu)
    getattr(sandbox.state, action)(message_id)
    assert (await api_error(feishu.patch_card(message_id, card()))).code == code
    assert sandbox.state.messages[message_id].responses[code] == 1


async def test_unknown_message_and_bad_receive_type(feishu: FeishuClient) -> None:
    assert (await api_error(feishu.patch_card("om_nope", card()))).code == 230001
    assert (await api_error(feishu.send_card("x", "phone", card(), ""))).code == 99992402


async def test_empty_image_is_refused(feishu: FeishuClient) -> None:
    assert (await api_error(feishu.upload_image(b""))).code == 234011


# --- faults ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sandbox_config", [SandboxConfig().unlimited()])
async def test_seeded_5xx_fraction_is_reproducible(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    message_id = await send(feishu)
    sandbox.state.faults.fail(0.3, status=503, seed=7)
    failures = 0
    for i in range(60):
        try:
            await feishu.patch_card(message_id, card(f"v{i}"))
        except FeishuAPIError as exc:
            assert exc.http_status == 503
            assert classify(exc).kind is OutcomeKind.BACKOFF
            failures += 1
    rng = random.Random(7)
    assert failures == sum(rng.random() < 0.3 for _ in range(60))
    assert 0 < failures < 60
    assert len(sandbox.state.messages[message_id].history) == 1 + 60 - failures


async def test_hang_becomes_transport_error_within_the_timeout(
    feishu: FeishuClient, sandbox: RunningSandbox
) -> None:
    message_id = await send(feishu)
    sandbox.state.faults.hang(1)
    settings = FeishuSettings(base_url=sandbox.base_url, timeout_seconds=0.3)
    async with FeishuClient(settings) as impatient:
        started = time.perf_counter()
        with pytest.raises(FeishuTransportError):
            await impatient.patch_card(message_id, card("lost"))
        assert time.perf_counter() - started < 3.0  # the timeout fired, not the sandbox's hang cap
    await feishu.patch_card(message_id, card("next one answers"))
    assert sandbox.state.messages[message_id].card == card("next one answers")


async def test_429_storm_then_recovery(
    feishu: FeishuClient, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    message_id = await send(feishu)
    sandbox.state.faults.storm_429(4.2)
    error = await api_error(feishu.patch_card(message_id, card()))
    assert (error.http_status, error.code, error.retry_after) == (429, 99991400, 5.0)
    await clock.advance(4.3)
    await feishu.patch_card(message_id, card("calm"))


async def test_slow_responses_still_answer(feishu: FeishuClient, sandbox: RunningSandbox) -> None:
    message_id = await send(feishu)
    sandbox.state.faults.slow(30)
    await feishu.patch_card(message_id, card("slowly"))
    sandbox.state.faults.clear()
    assert sandbox.state.messages[message_id].card == card("slowly")


# --- pure state ------------------------------------------------------------------------------


def test_sliding_window_admits_limit_per_span() -> None:
    window = SlidingWindow(2, 1.0)
    assert window.admit(0.0) is None
    assert window.admit(0.5) is None
    assert window.admit(0.9) == pytest.approx(0.1)
    assert window.admit(1.0) is None


def test_time_scale_speeds_sandbox_time() -> None:
    now = [100.0]
    state = SandboxState(SandboxConfig(time_scale=60), clock=lambda: now[0])
    now[0] += 1.0
    assert state.now() == 60.0
    assert state.gateway_limited(30).headers["x-ogw-ratelimit-reset"] == "0.500"


def test_token_reissued_only_when_less_than_30_minutes_remain() -> None:
    now = [0.0]
    state = SandboxState(SandboxConfig(), clock=lambda: now[0])
    first = state.issue_token("", "").body
    now[0] = 5000.0
    again = state.issue_token("", "").body
    assert again["tenant_access_token"] == first["tenant_access_token"]
    assert again["expire"] == 2200
    now[0] = 5500.0
    renewed = state.issue_token("", "").body
    assert renewed["tenant_access_token"] != first["tenant_access_token"]
    assert state.check_token(f"Bearer {first['tenant_access_token']}") is None  # both stay valid
