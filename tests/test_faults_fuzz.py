"""2,000 fuzzed runtime-API requests never get a 5xx, and the service is healthy afterwards.

A seeded generator (reproducible: a failure names the request's index and what was mutated) builds
valid-looking creates and event batches with one field mutated (wrong types, nulls, huge or odd
unicode strings, deep nesting, unknown fields), odd action queries, odd multipart image bodies, odd
paths and raw garbage. The whole app runs in-process on SQLite against the sandbox over real HTTP.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from feishu_progress.app import ADMIN_URL, SERVICES
from feishu_progress.config import Settings
from feishu_progress.db.engine import Database
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.sandbox.state import SandboxConfig
from tests.rigs import API_TOKEN, APP_ID, APP_SECRET, AUTH, Client, app_settings_for, eventually

pytestmark = pytest.mark.faults

SEED = 11_2024
REQUESTS = 2000
FRESH_TASK_EVERY = 100  # events after 'finished' are refused: new targets keep the batches meaningful
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
MAX_BODY = 8 * 1024 * 1024
CARD_WITHIN_SECONDS = 10.0

Json = Any


@dataclass
class Case:
    """One request to make, and what was done to it (shown when it fails)."""

    label: str
    method: str
    path: str
    json_body: Json = None
    raw: bytes | None = None
    form: list[tuple[str, bytes, str]] | None = None  # (field, bytes, content type)
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    raw_headers: list[tuple[bytes, bytes]] | None = None  # sent byte for byte, over a socket of its own
    expect: int | None = None  # the one right answer, when there is one


# --- odd values ---------------------------------------------------------------------------------

ODD_STRINGS = [
    "",
    " ",
    "\x00",
    "\u200b\u202e右到左\u202c",
    "😀" * 300,
    "\ud800",  # a lone surrogate: valid JSON ("\\ud800"), not encodable as UTF-8
    "<at id=all></at>**[x](javascript:alert(1))**",
    "${{7*7}}{{7*7}}%s%n",
    "\r\n\t" * 50,
    "om_" + "a" * 300,
    "../../open-apis/auth",
    "中文" * 2000,
]
ODD_NUMBERS: list[Any] = [-1, 0, 2**31, 2**63, 2**64, -(2**63) - 1, 10**30, 1e308, -0.0, 0.5, float("nan")]
ODD_NUMBERS += [float("inf"), float("-inf")]


DEEP_TOKEN = "\x00deep:{depth}:{shape}\x00"


def deep(rng: random.Random) -> str:
    """A stand-in ``to_json`` replaces by nesting that deep (json.dumps itself stops near 1,000 levels)."""
    return DEEP_TOKEN.format(depth=rng.choice([50, 500, 900, 3000, 100_000]), shape=rng.choice("[{"))


def to_json(value: Json) -> bytes:
    text = json.dumps(value)
    for depth in (50, 500, 900, 3000, 100_000):
        for shape, (opening, closing) in {"[": ("[", "]"), "{": ('{"k":', "}")}.items():
            token = json.dumps(DEEP_TOKEN.format(depth=depth, shape=shape))
            text = text.replace(token, opening * depth + '"bottom"' + closing * depth)
    return text.encode()


def huge_string(rng: random.Random) -> str:
    return rng.choice(["x", "中", "😀"]) * rng.choice([100_000, 1_000_001, 2_000_000])


def odd_value(rng: random.Random) -> Json:
    """Something a field should not hold (or holds only at its limits)."""
    pick = rng.randrange(10)
    if pick < 3:
        return rng.choice(ODD_STRINGS)
    if pick < 5:
        return rng.choice(ODD_NUMBERS)
    if pick == 5:
        return rng.choice([None, True, False])
    if pick == 6:
        return rng.choice([[], {}, [None], {"": None}, ["a", 1, None]])
    if pick == 7:
        return deep(rng)
    if pick == 8 and rng.random() < 0.1:  # keeps the run fast: a few multi-megabyte strings
        return huge_string(rng)
    return "".join(chr(rng.randrange(0x20, 0x2FFFF)) for _ in range(rng.randrange(1, 40)))


def mutate(rng: random.Random, target: dict[str, Any], keys: list[str]) -> str:
    """Change one thing about ``target`` (in place); returns what was done."""
    key = rng.choice(keys)
    action = rng.randrange(6)
    if action == 0 and key in target:
        del target[key]
        return f"dropped {key}"
    if action == 1:
        target["unexpected_" + str(rng.randrange(100))] = odd_value(rng)
        return "added an unknown field"
    value = odd_value(rng)
    target[key] = value
    return f"{key}={_brief(value)}"


def _brief(value: Json) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}… ({len(text)} chars)"


FEW_EVENTS = {"events": [{"type": "content", "text": "头"}]}
ODD_HEADERS: list[tuple[bytes, bytes, int | None]] = [
    (b"Idempotency-Key", b"\xff\xfe\xc3", 422),  # not UTF-8 (was a 503 from the database)
    (b"Idempotency-Key", "键-🔑".encode(), 422),
    # (Control characters never reach us: aiohttp's parser answers 400, and logs it as an error.)
    (b"Idempotency-Key", b"\x80" * 300, 422),
    (b"Idempotency-Key", b"sha256:" + b"0" * 64, None),
    (b"Authorization", b"Bearer \xff\xfe", 401),
    (b"Authorization", b"Basic Zm9vOmJhcg==", 401),
    (b"Content-Type", b"application/json; charset=\xff", None),
    (b"Content-Type", b"multipart/form-data; boundary=", 415),
    (b"Content-Type", b"text/plain", 415),
    (b"X-FP-Forwarded-By", b"\xff" * 10, None),
    (b"Accept-Language", b"\xe4\xb8" * 100, None),
]


# --- valid-looking requests -------------------------------------------------------------------------


def create_body() -> dict[str, Any]:
    return {
        "receive_id": "oc_fuzz",
        "receive_id_type": "chat_id",
        "requester_open_id": "ou_fuzz",
        "title": "模糊",
    }


EVENT_TEMPLATES: list[dict[str, Any]] = [
    {"type": "status", "status": "RUNNING", "round": 1},
    {"type": "status", "status": "WAITING", "round": 2},
    {"type": "content", "text": "进展"},
    {"type": "content_delta", "text": "增量"},
    {"type": "tool_started", "call_id": "c1", "name": "shell", "args": {"command": "ls"}},
    {"type": "tool_args", "call_id": "c1", "args": {"command": "ls -la"}},
    {"type": "tool_finished", "call_id": "c1", "result": {"output": "ok"}},
    {"type": "round_finished", "round": 1},
    {"type": "subagent_started", "task_id": "s1", "agent_type": "explorer", "title": "查资料"},
    {"type": "subagent_round", "task_id": "s1", "round": 2},
    {"type": "subagent_status", "task_id": "s1", "status": "RECOVERING"},
    {"type": "subagent_finished", "task_id": "s1", "status": "COMPLETED", "total_rounds": 2},
    {"type": "ask", "ask_id": "a1", "questions": [{"question": "继续?", "options": ["是", "否"]}]},
    {"type": "approval", "approval_id": "p1", "tool_name": "shell", "summary": "rm"},
    {"type": "finished", "status": "COMPLETED", "content": "完成"},
]


def event_batch(rng: random.Random) -> tuple[dict[str, Any], str]:
    events = [copy.deepcopy(rng.choice(EVENT_TEMPLATES[:-1])) for _ in range(rng.randrange(1, 5))]
    if rng.random() < 0.05:
        events.append(copy.deepcopy(EVENT_TEMPLATES[-1]))
    batch: dict[str, Any] = {"events": events}
    if rng.random() < 0.1:
        return batch, mutate(rng, batch, ["events"])
    victim = rng.choice(events)
    return batch, f"{victim['type']}: " + mutate(rng, victim, list(victim))


# --- the generator ----------------------------------------------------------------------------------


class Fuzzer:
    def __init__(self, rng: random.Random, targets: Callable[[], list[int]]) -> None:
        self.rng = rng
        self.targets = targets

    def case(self) -> Case:
        kinds = [self.create, self.events, self.events, self.events, self.actions, self.image, self.garbage]
        kinds += [self.headers, self.nesting, self.multipart]
        return self.rng.choice(kinds)()

    def headers(self) -> Case:
        """A valid create or batch with one odd header, sent byte for byte (not UTF-8, controls...)."""
        rng = self.rng
        name, value, expect = rng.choice(ODD_HEADERS)
        events_path = f"/v1/tasks/{rng.choice(self.targets())}/events"
        path, body = rng.choice([("/v1/tasks", create_body()), (events_path, FEW_EVENTS)])
        raw_headers = [
            (b"Authorization", f"Bearer {API_TOKEN}".encode()),
            (b"Content-Type", b"application/json"),
        ]
        raw_headers = [(n, v) for n, v in raw_headers if n.lower() != name.lower()] + [(name, value)]
        label = f"header {name.decode()}: {value[:40]!r} on {path}"
        return Case(label, "POST", path, raw=to_json(body), raw_headers=raw_headers, expect=expect)

    def nesting(self) -> Case:
        """Arrays or objects nested around the limit (64), at the top or inside an event's arguments."""
        rng = self.rng
        depth = rng.choice([10, 60, 65, 200, 970, 5000])
        opening, closing = rng.choice([(b"[", b"]"), (b'{"k":', b"}")])
        nested = opening * depth + b"1" + closing * depth
        template = rng.choice(
            [
                b'{"events": [{"type": "tool_started", "call_id": "c", "name": "x", "args": %s}]}',
                b'{"events": %s}',
            ]
        )
        raw = template % nested
        too_deep = depth > 64  # the events object and its list add 1-3 levels: 60 stays within
        headers = {**AUTH, "Content-Type": "application/json"}
        label = f"nesting {depth} deep ({opening.decode()}) in {template[:30]!r}"
        return Case(
            label,
            "POST",
            f"/v1/tasks/{rng.choice(self.targets())}/events",
            raw=raw,
            headers=headers,
            expect=422 if too_deep else None,
        )

    def multipart(self) -> Case:
        """An image upload with parts other than ``image``: junk, many, nested, unnamed."""
        rng = self.rng
        parts: list[tuple[str, bytes, str]] = [("image", PNG, "image/png")]
        pick = rng.randrange(4)
        if pick == 0:
            parts.insert(0, ("junk", rng.randbytes(rng.randrange(1, 300_000)), "application/octet-stream"))
        elif pick == 1:
            parts = [(f"p{i}", b"x", "text/plain") for i in range(rng.choice([10, 500, 3000]))] + parts
        elif pick == 2:
            inner = b"--in\r\nContent-Disposition: form-data; name=image\r\n\r\n" + PNG + b"\r\n--in--\r\n"
            parts = [("image", inner, "multipart/mixed; boundary=in")]
        else:
            parts = [("", PNG, "image/png")]
        label = f"multipart: {[name for name, _, _ in parts][:3]} ({len(parts)} parts)"
        return Case(label, "POST", self.task_path() + "/images", form=parts, headers=dict(AUTH))

    def task_path(self) -> str:
        rng = self.rng
        if rng.random() < 0.85:
            return f"/v1/tasks/{rng.choice(self.targets())}"
        odd = ["0", "-1", "abc", "1e3", "٣", "²", "9" * 19, "9" * 30, "%2e%2e", "1%00", " 1", "０"]
        return f"/v1/tasks/{rng.choice(odd)}"

    def create(self) -> Case:
        body = create_body()
        keys = [*body, "session_id", "reply_to_message_id", "locale"]
        label = mutate(self.rng, body, keys) if self.rng.random() < 0.9 else "valid"
        headers = dict(AUTH)
        if self.rng.random() < 0.3:
            key = self.rng.choice(["", " ", "k" * 256, "键-🔑", "run-1", "\t"])
            headers["Idempotency-Key"] = key
            label += f", Idempotency-Key={_brief(key)}"
        return Case("create: " + label, "POST", "/v1/tasks", json_body=body, headers=headers)

    def events(self) -> Case:
        batch, label = event_batch(self.rng)
        return Case("events: " + label, "POST", self.task_path() + "/events", json_body=batch, headers=AUTH)

    def actions(self) -> Case:
        rng = self.rng
        odd = [
            "",
            "-1",
            "0",
            "1e3",
            "nan",
            "inf",
            "-0",
            "9" * 40,
            "0x10",
            "٠",  # an Arabic-Indic zero: float() and int() take it (a one would make a 1 s long poll)
            "²",
            "0.01",
            "1e-9",
            "60.000001",
        ]
        params = {"after": rng.choice([*odd, "0", "5"]), "wait": rng.choice([*odd, "0", "0.02"])}
        if rng.random() < 0.2:
            params[rng.choice(["after", "x", ""])] = rng.choice(odd)
        return Case(f"actions: {params}", "GET", self.task_path() + "/actions", params=params, headers=AUTH)

    def image(self) -> Case:
        rng = self.rng
        choices: list[tuple[str, list[tuple[str, bytes, str]] | None, bytes | None]] = [
            ("no image field", [("other", PNG, "image/png")], None),
            ("empty image", [("image", b"", "image/png")], None),
            ("not an image", [("image", b"#!/bin/sh\nrm -rf /", "image/png")], None),
            ("a png", [("image", PNG + bytes([rng.randrange(256)]), "image/png")], None),
            ("two images", [("image", PNG, "image/png"), ("image", b"GIF89a", "image/gif")], None),
            ("truncated multipart", None, b"--b\r\nContent-Disposition: form-data; name=image\r\n\r\nabc"),
            ("garbage multipart", None, rng.randbytes(rng.randrange(1, 2000))),
        ]
        label, form, raw = rng.choice(choices)
        headers = dict(AUTH)
        if raw is not None:
            headers["Content-Type"] = rng.choice(["multipart/form-data; boundary=b", "multipart/form-data"])
        return Case(
            "image: " + label, "POST", self.task_path() + "/images", raw=raw, form=form, headers=headers
        )

    def garbage(self) -> Case:
        rng = self.rng
        path = rng.choice(["/v1/tasks", self.task_path() + "/events"])
        bodies: list[tuple[str, bytes, str]] = [
            ("random bytes", rng.randbytes(rng.randrange(0, 3000)), "application/json"),
            ("deep nesting", b"[" * 200_000 + b"]" * 200_000, "application/json"),
            ("deep objects", b'{"a":' * 5000 + b"1" + b"}" * 5000, "application/json"),
            (
                "not an object",
                json.dumps(rng.choice([[], 1, "x", None, [{"events": []}]])).encode(),
                "application/json",
            ),
            ("text body", b"events=1", "text/plain"),
            ("bad utf-8", b'{"events": [{"type": "content", "text": "\xff\xfe"}]}', "application/json"),
            (
                "NaN literal",
                b'{"events": [{"type": "status", "status": "RUNNING", "round": NaN}]}',
                "application/json",
            ),
            ("over the limit", b" " * (MAX_BODY + 1), "application/json"),
        ]
        label, raw, content_type = rng.choice(bodies)
        headers = {**AUTH, "Content-Type": content_type}
        return Case(f"garbage to {path}: {label}", "POST", path, raw=raw, headers=headers)


# --- running it --------------------------------------------------------------------------------------


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET).unlimited()  # the fuzz is no rate test


@pytest.fixture
def app_settings(sandbox: RunningSandbox, db: Database, db_url: str) -> Settings:
    """The app on ``db_url`` (emptied first by ``db``)."""
    return app_settings_for(sandbox, db_url)


async def send_raw(client: Client, case: Case) -> int:
    """``case`` written to the socket by hand: aiohttp's client only sends headers it can encode."""
    assert case.raw_headers is not None and case.raw is not None
    reader, writer = await asyncio.open_connection(client.host, client.port)
    lines = [f"{case.method} {case.path} HTTP/1.1".encode(), f"Host: {client.host}".encode()]
    lines += [name + b": " + value for name, value in case.raw_headers]
    lines += [f"Content-Length: {len(case.raw)}".encode(), b"Connection: close"]
    writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + case.raw)
    try:
        status_line = await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


async def send(client: Client, case: Case) -> int:
    if case.raw_headers is not None:
        return await send_raw(client, case)
    headers = dict(case.headers)
    # Bodies as files: aiohttp streams those (raw bytes over 1 MB warn that they block the loop).
    data: Any = None if case.raw is None else io.BytesIO(case.raw)
    if case.json_body is not None:
        data = io.BytesIO(to_json(case.json_body))
        headers["Content-Type"] = "application/json"
    elif case.form is not None:
        form = aiohttp.FormData()
        for name, content, content_type in case.form:
            form.add_field(name, io.BytesIO(content), filename="f.bin", content_type=content_type)
        data = form
    async with client.request(case.method, case.path, data=data, headers=headers, params=case.params) as r:
        await r.read()
        return r.status


async def new_task(client: Client) -> tuple[int, str]:
    response = await client.post("/v1/tasks", json=create_body(), headers=AUTH)
    assert response.status == 201, await response.text()
    answer = await response.json()
    return answer["session_id"], answer["message_id"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # in-process on SQLite, for speed
async def test_fuzzed_requests_never_get_a_5xx_and_the_service_stays_healthy(
    client: Client, sandbox: RunningSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="feishu_progress")
    targets: list[int] = []
    fuzzer = Fuzzer(random.Random(SEED), lambda: targets[-3:])
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for index in range(REQUESTS):
        if index % FRESH_TASK_EVERY == 0:
            targets.append((await new_task(client))[0])
        case = fuzzer.case()
        status = await send(client, case)
        statuses[status] += 1
        if status >= 500 or (case.expect is not None and status != case.expect):
            failures.append(f"#{index} {status} {case.method} {case.path} {case.label}")
    assert failures == [], "\n".join(failures[:50])
    errors = [record.getMessage()[:300] for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == []
    # The fuzz reached every kind of answer, not only the first check that refuses a body.
    assert min(statuses[201], statuses[202], statuses[400], statuses[404], statuses[422]) > 10, statuses

    session_id, message_id = await new_task(client)
    after = {"events": [{"type": "content", "text": "模糊测试之后仍然健康"}]}
    response = await client.post(f"/v1/tasks/{session_id}/events", json=after, headers=AUTH)
    assert response.status == 202
    await eventually(
        lambda: (
            "模糊测试之后仍然健康" in json.dumps(sandbox.state.messages[message_id].card, ensure_ascii=False)
        ),
        timeout=CARD_WITHIN_SECONDS,
        what="the card to show the event",
    )
    services = client.app[SERVICES]
    async with client.session.get(f"{client.app[ADMIN_URL]}/readyz") as ready:
        assert ready.status == 200, await ready.text()
    # Every state the fuzz got accepted can be saved: a 202 never hides a state the database refuses.
    service = services.service
    await service.snapshots.flush()
    unsaved = [task.session_id for task in service.registry if service.snapshots.is_dirty(task.session_id)]
    assert unsaved == []


async def test_values_at_the_column_limits_are_saved_and_beyond_them_refused(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """What the edge accepts, the database can hold (MariaDB refuses what does not fit; SQLite does not)."""
    caplog.set_level(logging.WARNING, logger="feishu_progress")
    too_long = [
        {"requester_open_id": "o" * 65},
        {"receive_id": "r" * 256},
        {"reply_to_message_id": "om_" + "m" * 62},
    ]
    for fields in too_long:
        response = await client.post("/v1/tasks", json=create_body() | fields, headers=AUTH)
        assert response.status == 422, (fields, await response.text())
    fitting = create_body() | {"requester_open_id": "o" * 64, "receive_id": "r" * 255}
    response = await client.post("/v1/tasks", json=fitting, headers=AUTH)
    assert response.status == 201, await response.text()
    session_id = (await response.json())["session_id"]

    async def post(*events: dict[str, Any]) -> int:
        batch = {"events": list(events)}
        return (await client.post(f"/v1/tasks/{session_id}/events", json=batch, headers=AUTH)).status

    biggest = 2**31 - 1
    assert await post({"type": "status", "status": "RUNNING", "round": biggest + 1}) == 422
    assert await post({"type": "subagent_started", "task_id": "t" * 65}) == 422
    assert (
        await post({"type": "subagent_finished", "task_id": "t", "status": "FAILED", "total_rounds": 2**31})
        == 422
    )
    assert (
        await post(
            {"type": "status", "status": "RUNNING", "round": biggest},
            {
                "type": "subagent_started",
                "task_id": "t" * 64,
                "agent_type": "a" * 64,
                "child_session_id": "c" * 64,
            },
            {
                "type": "subagent_finished",
                "task_id": "t" * 64,
                "status": "COMPLETED",
                "total_rounds": biggest,
            },
        )
        == 202
    )
    service = client.app[SERVICES].service
    await service.snapshots.flush()
    assert not service.snapshots.is_dirty(session_id)
    record = await service.snapshots.load(session_id)
    assert record is not None and record.round == biggest
    assert [r.getMessage() for r in caplog.records if "could not be stored" in r.getMessage()] == []
