"""The shared rigs themselves (tests/rigs.py): ``eventually``, and the sandbox and app fixtures."""

from __future__ import annotations

import itertools

import pytest

from feishu_progress.sandbox import RunningSandbox
from tests.rigs import APP_ID, AUTH, Client, eventually


async def test_eventually_returns_the_first_value_that_holds() -> None:
    counter = itertools.count()
    assert await eventually(lambda: next(counter), until=lambda n: n >= 3, interval=0) == 3
    assert await eventually(lambda: next(counter) >= 6, interval=0) is True


async def test_eventually_awaits_an_async_probe() -> None:
    seen: list[int] = []

    async def probe() -> list[int] | None:
        seen.append(len(seen))
        return seen if len(seen) == 2 else None

    assert await eventually(probe, interval=0) == [0, 1]


async def test_a_timeout_names_what_was_awaited_and_the_last_value() -> None:
    with pytest.raises(AssertionError, match=r"waiting for the answer; last value: 'no'") as caught:
        await eventually(lambda: "no", until=lambda answer: answer == "yes", timeout=0.05, what="the answer")
    assert "timed out after 0.05 s" in str(caught.value)
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: \[\] == \[1\].*last value: False"):
        await eventually(lambda: [] == [1], timeout=0.01)


async def test_a_long_last_value_is_cut() -> None:
    with pytest.raises(AssertionError, match=r"\.\.\. \(10002 chars\)$"):
        await eventually(lambda: "x" * 10_000, until=lambda _: False, timeout=0.01)


async def test_the_client_is_the_app_on_the_sandbox_as_the_rigs_app(
    client: Client, sandbox: RunningSandbox
) -> None:
    body = {
        "receive_id": "oc_rigs",
        "receive_id_type": "chat_id",
        "requester_open_id": "ou_rigs",
        "title": "t",
    }
    response = await client.post("/v1/tasks", json=body, headers=AUTH)
    assert response.status == 201, await response.text()
    message_id = (await response.json())["message_id"]
    assert message_id in sandbox.state.messages  # the sandbox issued the token only for the rigs' app
    assert sandbox.state.config.app_id == APP_ID
