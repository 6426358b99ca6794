"""Issue 15 #5: memory is bounded — what a runtime sends is capped on arrival, finished tasks leave memory.

Before the fix: 7 MiB results × 40 took the process to 1.25 GiB RSS, a round kept 2,000 calls, and of 200
finished tasks 171 were still held. Through the real app (sandbox mode, real HTTP to the sandbox).
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feishu_progress.app import SERVICES
from feishu_progress.config import AdminSettings, HttpSettings, Settings
from feishu_progress.errors import EventRejected
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.bounds import MAX_TOOL_VALUE_BYTES, bound_json, fits, json_size
from feishu_progress.runtime.state import MAX_IMAGE_KEYS, MAX_PENDING, MAX_TOOLS_KEPT, TaskState
from feishu_progress.runtime.task import Task
from tests.rigs import Client, eventually

MIB = 1024 * 1024


@pytest.fixture
def app_settings(tmp_path: Path) -> Settings:
    # Sandbox mode: no app id, so the service runs its own sandbox (no sandbox fixture needed).
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'fp.db'}",
        http=HttpSettings(port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
    )


async def create(client: Client) -> int:
    body = {"receive_id": "oc_mem", "receive_id_type": "chat_id", "requester_open_id": "ou_mem"}
    response = await client.post("/v1/tasks", json=body)
    assert response.status == 201, await response.text()
    session_id: int = (await response.json())["session_id"]
    return session_id


async def post(client: Client, session_id: int, *events: dict[str, Any]) -> int:
    body = json.dumps({"events": list(events)}).encode()
    # A file object: aiohttp streams it (raw bytes over 1 MiB warn that they block the loop).
    response = await client.post(
        f"/v1/tasks/{session_id}/events", data=io.BytesIO(body), headers={"Content-Type": "application/json"}
    )
    return response.status


def held(client: Client) -> dict[int, Task]:
    service = client.server.app[SERVICES].service
    assert service is not None
    return {task.session_id: task for task in service.registry}


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * 4096


# -- caps on arrival (pure) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "长" * (3 * MIB),
        {"stdout": "x" * (7 * MIB), "exit_code": 1},
        {"items": [{"n": n, "text": "y" * 100} for n in range(10_000)]},
        {"images": [{"image_url": f"https://cdn.example/{n}.png", "size_bytes": 2048} for n in range(500)]},
    ],
    ids=["text", "stdout", "long-list", "many-images"],
)
def test_a_large_value_is_cut_to_the_cap_and_keeps_its_shape(value: Any) -> None:
    kept = bound_json(value)
    assert json_size(kept) <= MAX_TOOL_VALUE_BYTES
    assert type(kept) is type(value)
    if isinstance(value, dict):
        assert kept.keys() == value.keys()  # the parsers still find their fields


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),  # control characters, quotes, backslashes, astral planes: every escape JSON has
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=30,
)


@given(value=JSON_VALUES, limit=st.integers(min_value=0, max_value=400))
def test_the_quick_size_check_agrees_with_the_exact_one(value: Any, limit: int) -> None:
    assert fits(value, limit) == (json_size(value) <= limit)


def test_a_round_keeps_its_newest_calls_and_counts_the_rest() -> None:
    state = TaskState(session_id=1, requester_open_id="ou", receive_id="oc", receive_id_type="chat_id")
    for n in range(2_000):
        state.apply(ev.ToolStartedEvent(type="tool_started", call_id=f"c{n}", name="shell", args={"n": n}))
    assert len(state.tools) == MAX_TOOLS_KEPT
    assert state.tools_dropped == 2_000 - MAX_TOOLS_KEPT
    assert list(state.tools)[-1] == "c1999"


def test_more_pending_questions_than_the_cap_are_refused_whole() -> None:
    state = TaskState(session_id=1, requester_open_id="ou", receive_id="oc", receive_id_type="chat_id")
    asks = [
        ev.AskEvent(type="ask", ask_id=f"a{n}", questions=[ev.AskQuestionModel(question="继续吗?")])
        for n in range(MAX_PENDING + 1)
    ]
    with pytest.raises(EventRejected) as refused:
        state.check_batch(asks)
    assert refused.value.location == f"events[{MAX_PENDING}].ask_id"


def test_images_of_tool_results_stay_within_the_cap_of_image_keys() -> None:
    state = TaskState(session_id=1, requester_open_id="ou", receive_id="oc", receive_id_type="chat_id")
    for n in range(3):
        state.add_result_images({f"/img/{n}-{i}.png": f"img_{n}_{i}" for i in range(60)})
    assert len(state.image_keys) == MAX_IMAGE_KEYS
    state.add_result_images({"/img/0-0.png": "img_new"})  # a known source may get its new key
    assert state.image_keys["/img/0-0.png"] == "img_new"


# -- through the app ------------------------------------------------------------------------------


async def test_finished_tasks_leave_memory_once_their_final_is_delivered(client: Client) -> None:
    sessions = [await create(client) for _ in range(200)]
    assert len(held(client)) == 200
    done = {"type": "finished", "status": "COMPLETED"}
    statuses = await asyncio.gather(*(post(client, session_id, done) for session_id in sessions))
    assert set(statuses) == {202}
    # The finals go out within the app budget (50/s): a few seconds.
    await eventually(
        lambda: len(held(client)), until=lambda count: count == 0, timeout=30, what="no finished task held"
    )
    view = await client.get(f"/v1/tasks/{sessions[0]}")  # the database still has them
    assert view.status == 200 and (await view.json())["status"] == "COMPLETED"


async def test_large_tool_results_do_not_grow_the_process(client: Client) -> None:
    session_id = await create(client)
    await post(client, session_id, {"type": "status", "status": "RUNNING", "round": 1})
    result = {"stdout": "z" * (7 * MIB), "exit_code": 0}
    before = rss_bytes()
    for n in range(40):
        started = {"type": "tool_started", "call_id": f"c{n}", "name": "shell", "args": {"cmd": "cat big"}}
        finished = {"type": "tool_finished", "call_id": f"c{n}", "result": result}
        assert await post(client, session_id, started, finished) == 202
    grown = rss_bytes() - before
    task = held(client)[session_id]
    kept = [call.result for call in task.state.tools.values()]
    assert all(json_size(value) <= MAX_TOOL_VALUE_BYTES for value in kept)
    assert len(task.state.to_snapshot()) < 1 * MIB  # 40 capped results, not 280 MiB
    # 40 × 7 MiB arrived; what stays is the capped values (the 1.25 GiB of before was all of it kept).
    assert grown < 150 * MIB, f"RSS grew {grown / MIB:.0f} MiB"
    card = json.dumps((await (await client.get(f"/v1/tasks/{session_id}")).json())["card"])
    assert len(card.encode()) < 30 * 1024
