"""Issue 26 item 10: an Idempotency-Key is bound to the request it first came with.

The same key with the same request is a repeat (the same task; the batch not applied twice); the same
key with another request is a 422 naming ``Idempotency-Key`` — never someone else's task, never events
answered 202 and silently dropped. The app runs in-process on SQLite against the sandbox.
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.rigs import AUTH

TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_a", "title": "t"}


async def test_a_create_key_reused_for_another_request_is_a_422(client: TestClient[Any, Any]) -> None:
    key = AUTH | {"Idempotency-Key": "run-1"}
    first = await client.post("/v1/tasks", json=TASK, headers=key)
    assert first.status == 201
    repeat = await client.post("/v1/tasks", json=TASK, headers=key)
    assert repeat.status == 201
    assert (await repeat.json())["session_id"] == (await first.json())["session_id"]
    someone_else = TASK | {"receive_id": "oc_2", "requester_open_id": "ou_b"}
    reused = await client.post("/v1/tasks", json=someone_else, headers=key)
    assert reused.status == 422
    answer = await reused.json()
    assert answer["field"] == "Idempotency-Key" and "message_id" not in answer


async def test_a_batch_key_reused_with_other_events_is_a_422_not_a_silent_drop(
    client: TestClient[Any, Any],
) -> None:
    created = await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json()
    events = f"/v1/tasks/{created['session_id']}/events"
    key = AUTH | {"Idempotency-Key": "batch-1"}
    first = {"events": [{"type": "content", "text": "一"}]}
    assert (await client.post(events, json=first, headers=key)).status == 202
    assert (await client.post(events, json=first, headers=key)).status == 202  # a repeat
    other = {"events": [{"type": "content", "text": "二"}]}
    reused = await client.post(events, json=other, headers=key)
    assert reused.status == 422
    assert (await reused.json())["field"] == "Idempotency-Key"
    view = await (await client.get(f"/v1/tasks/{created['session_id']}", headers=AUTH)).json()
    assert "一" in str(view) and "二" not in str(view)
