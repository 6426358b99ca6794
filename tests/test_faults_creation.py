"""``POST /v1/tasks`` and image hand-over survive Feishu blips, and never cost the runtime a task.

The whole app in-process, over real HTTP to the sandbox, on SQLite and MariaDB. The Feishu client's
backoff runs on the app's real clock here (the app's loops need one), so a create whose every attempt
fails waits ~1-2 s: these tests keep such cases few.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from feishu_progress.config import Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import TaskRepository
from feishu_progress.errors import FIRST_CARD_RETRY_AFTER
from feishu_progress.feishu.retry import FeishuRetryPolicy
from feishu_progress.sandbox.server import RunningSandbox
from tests.rigs import AUTH, Client, app_settings_for, eventually

pytestmark = pytest.mark.faults

ATTEMPTS = FeishuRetryPolicy().attempts
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64

# For tests where the database only stores what Feishu decided: SQLite alone (the rest run on both).
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def app_settings(sandbox: RunningSandbox, db: Database, db_url: str) -> Settings:
    """The app on ``db_url`` (``db`` emptied it first, and is how a test reads what was saved)."""
    return app_settings_for(sandbox, db_url)


def create_body(**fields: Any) -> dict[str, Any]:
    return {
        "receive_id": "oc_faults",
        "receive_id_type": "chat_id",
        "requester_open_id": "ou_requester",
        "title": "故障测试",
        **fields,
    }


async def create(
    client: Client, body: Mapping[str, Any], key: str | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {**AUTH, **({"Idempotency-Key": key} if key is not None else {})}
    response = await client.post("/v1/tasks", json=body, headers=headers)
    answer: dict[str, Any] = await response.json()
    return response.status, answer | {"_retry_after_header": response.headers.get("Retry-After")}


def created(answer: Mapping[str, Any]) -> tuple[int, str]:
    return answer["session_id"], answer["message_id"]


def assert_retryable_503(status: int, answer: Mapping[str, Any]) -> None:
    assert status == 503, answer
    assert answer["error"] == "unavailable"
    assert answer["retry_after"] == FIRST_CARD_RETRY_AFTER
    assert answer["_retry_after_header"] == str(FIRST_CARD_RETRY_AFTER)


async def test_two_failed_sends_still_create_the_task_with_one_message(
    client: Client, sandbox: RunningSandbox, db: Database
) -> None:
    sandbox.state.faults.fail_next(2, status=500, endpoints=("send",))
    status, answer = await create(client, create_body())
    assert status == 201, answer
    session_id, message_id = created(answer)
    assert list(sandbox.state.messages) == [message_id]
    assert sandbox.state.requests["send"] == 3
    record = await TaskRepository(db).get(session_id)
    assert record is not None and record.message_id == message_id
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert (task["status"], task["message_id"]) == ("RUNNING", message_id)


async def test_when_every_send_fails_the_runtime_gets_a_retryable_503_and_nothing_stays_behind(
    client: Client, sandbox: RunningSandbox, db: Database
) -> None:
    session_id = 7_000_000_001  # the runtime's own id, so it can ask about it afterwards
    sandbox.state.faults.outage(endpoints=("send",))
    status, answer = await create(client, create_body(session_id=session_id))
    assert_retryable_503(status, answer)
    assert sandbox.state.requests["send"] == ATTEMPTS
    assert (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).status == 404
    assert await TaskRepository(db).get(session_id) is None
    assert sandbox.state.messages == {}

    sandbox.state.faults.clear()  # Feishu is back: the runtime's retry is a plain create, not a 409
    status, answer = await create(client, create_body(session_id=session_id))
    assert status == 201, answer
    assert created(answer)[0] == session_id
    assert len(sandbox.state.messages) == 1


async def test_a_repeated_idempotency_key_answers_the_same_task_and_sends_once(
    client: Client, sandbox: RunningSandbox, db: Database
) -> None:
    first_status, first = await create(client, create_body(), key="run-42/create")
    again_status, again = await create(client, create_body(), key="run-42/create")
    assert (first_status, again_status) == (201, 201)
    assert created(again) == created(first)
    assert len(sandbox.state.messages) == 1
    assert sandbox.state.requests["send"] == 1
    other_status, other = await create(client, create_body(), key="run-43/create")
    assert other_status == 201 and created(other)[0] != created(first)[0]


async def test_concurrent_creates_with_one_key_become_one_task(
    client: Client, sandbox: RunningSandbox
) -> None:
    answers = await asyncio.gather(*(create(client, create_body(), key="run-44/create") for _ in range(4)))
    assert {status for status, _ in answers} == {201}
    assert len({created(answer) for _, answer in answers}) == 1
    assert len(sandbox.state.messages) == 1


async def test_a_key_whose_sends_were_all_lost_resumes_the_same_task_and_message(
    client: Client, sandbox: RunningSandbox, db: Database
) -> None:
    # Feishu made the card on the first attempt; every answer was lost on the way back.
    sandbox.state.faults.lose_answers(ATTEMPTS, endpoints=("send",))
    status, answer = await create(client, create_body(), key="run-45/create")
    assert_retryable_503(status, answer)
    [made_by_feishu] = list(sandbox.state.messages)

    status, answer = await create(client, create_body(), key="run-45/create")
    assert status == 201, answer
    session_id, message_id = created(answer)
    assert message_id == made_by_feishu  # the same uuid found the card instead of sending a second
    assert len(sandbox.state.messages) == 1
    record = await TaskRepository(db).find_by_idempotency_key("run-45/create")
    assert record is not None and (record.session_id, record.message_id) == (session_id, message_id)


@sqlite_only
async def test_a_reply_survives_failed_and_lost_attempts(client: Client, sandbox: RunningSandbox) -> None:
    status, parent = await create(client, create_body())
    assert status == 201
    parent_id = parent["message_id"]
    sandbox.state.faults.fail_next(1, endpoints=("reply",))
    sandbox.state.faults.lose_answers(1, endpoints=("reply",))
    status, answer = await create(client, create_body(reply_to_message_id=parent_id), key="run-46/reply")
    assert status == 201, answer
    replies = [m.message_id for m in sandbox.state.messages.values() if m.parent_id == parent_id]
    assert replies == [answer["message_id"]]
    assert sandbox.state.requests["reply"] == 3


@sqlite_only
async def test_a_reply_whose_answers_were_all_lost_is_resumed_by_its_key(
    client: Client, sandbox: RunningSandbox
) -> None:
    status, parent = await create(client, create_body())
    parent_id = parent["message_id"]
    sandbox.state.faults.lose_answers(ATTEMPTS, endpoints=("reply",))
    body = create_body(reply_to_message_id=parent_id)
    assert_retryable_503(*await create(client, body, key="run-47/reply"))
    status, answer = await create(client, body, key="run-47/reply")
    assert status == 201, answer
    replies = [m.message_id for m in sandbox.state.messages.values() if m.parent_id == parent_id]
    assert replies == [answer["message_id"]]


async def upload(client: Client, session_id: int, data: bytes) -> aiohttp.ClientResponse:
    form = aiohttp.FormData()
    form.add_field("image", io.BytesIO(data), filename="x.png", content_type="application/octet-stream")
    return await client.post(f"/v1/tasks/{session_id}/images", data=form, headers=AUTH)


@sqlite_only
async def test_an_image_hand_over_survives_two_failed_uploads(
    client: Client, sandbox: RunningSandbox
) -> None:
    _, answer = await create(client, create_body())
    sandbox.state.faults.fail_next(2, status=502, endpoints=("image",))
    response = await upload(client, answer["session_id"], PNG)
    assert response.status == 201, await response.text()
    uploaded = await response.json()
    assert sandbox.state.images == {uploaded["image_key"]: PNG}


@sqlite_only
async def test_an_image_feishu_never_takes_is_a_retryable_503_and_names_nothing(
    client: Client, sandbox: RunningSandbox
) -> None:
    _, answer = await create(client, create_body())
    session_id = answer["session_id"]
    sandbox.state.faults.outage(endpoints=("image",))
    response = await upload(client, session_id, PNG)
    assert response.status == 503, await response.text()
    assert (await response.json())["retry_after"] > 0
    assert sandbox.state.requests["image"] == ATTEMPTS
    task = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert "fpimg:" not in json.dumps(task) and "img_" not in json.dumps(task["card"])

    sandbox.state.faults.clear()
    retried = await upload(client, session_id, PNG)
    assert retried.status == 201
    assert list(sandbox.state.images) == [(await retried.json())["image_key"]]


def test_the_first_card_uuid_of_a_key_fits_feishu() -> None:
    from feishu_progress.runtime.creation import first_card_uuid

    long_key = "k" * 255
    uuid = first_card_uuid(1, long_key)
    assert len(uuid) <= 50 and uuid == first_card_uuid(2, long_key)  # the key, not the row, decides
    assert uuid != first_card_uuid(1, long_key[:-1] + "j")


async def test_a_batch_sent_again_with_its_key_is_applied_once(client: Client, db: Database) -> None:
    """A runtime whose 202 got lost (or that got a 503 from an instance that had forwarded the batch to
    a writer that applied it) sends the batch again with the same Idempotency-Key."""
    status, answer = await create(client, create_body())
    assert status == 201, answer
    session_id, _ = created(answer)
    path = f"/v1/tasks/{session_id}/events"

    async def send(text: str, key: str | None) -> dict[str, Any]:
        headers = {**AUTH, **({"Idempotency-Key": key} if key is not None else {})}
        events = {"events": [{"type": "content_delta", "text": text}]}
        response = await client.post(path, json=events, headers=headers)
        assert response.status == 202
        accepted: dict[str, Any] = await response.json()
        return accepted

    assert await send("甲", "batch-1") == {"accepted": 1}
    assert await send("甲", "batch-1") == {"accepted": 1}  # answered as the first time, not applied
    await send("乙", "batch-2")
    await send("丙", None)
    await send("丙", None)  # without a key a repeat is a new batch
    view = await (await client.get(f"/v1/tasks/{session_id}", headers=AUTH)).json()
    assert "甲乙丙丙" in json.dumps(view["card"], ensure_ascii=False)
    assert "甲甲" not in json.dumps(view["card"], ensure_ascii=False)
    # Remembered in the saved state (the periodic save): an instance taking the task over knows it.
    saved = await eventually(
        lambda: TaskRepository(db).get(session_id),
        until=lambda saved: saved is not None and saved.snapshot is not None and "甲乙丙丙" in saved.snapshot,
        timeout=5,
    )
    assert saved is not None and saved.snapshot is not None
    assert len(json.loads(saved.snapshot)["applied_batches"]) == 2
