"""Issue 17 item 2: the OpenAPI 3.1 contract cannot drift from the service.

The document is valid OpenAPI 3.1 and equal to the committed docs/openapi.json; each of its examples is
valid against the schema it illustrates (request examples also parse with the service's own models);
and, against the real app in sandbox mode (in-process, over HTTP), every status each endpoint documents
is provoked and the real body validated against the document's schema for that path and status — with
``additionalProperties: false`` added wherever the document lists an object's properties, so a field the
service sends but the document does not name fails too.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from jsonschema import Draft202012Validator, FormatChecker
from openapi_spec_validator import validate as validate_openapi
from prometheus_client import CollectorRegistry
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CallbackSettings,
    FeishuSettings,
    HttpSettings,
    Settings,
)
from feishu_progress.demo import tiny_png
from feishu_progress.runtime.events import CreateTaskRequest, EventBatch, parse_model
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.services import Services
from feishu_progress.web import http as web_http
from feishu_progress.web.openapi import OPENAPI_PATH, openapi_document, openapi_json
from feishu_progress.web.openapi_examples import EVENT_EXAMPLES

REPO = Path(__file__).resolve().parent.parent
DOC_URI = "urn:feishu-progress:openapi"
TOKEN = "contract-token"
JSON = "application/json"
JSON_TYPE = {"Content-Type": JSON}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUESTER = "ou_requester"
SLOW_BODY_SECONDS = 0.3  # the server's body deadline in these tests (10 s in production)
CALLBACK_BODY_LIMIT = 16 * 1024

TASKS, TASK = "/v1/tasks", "/v1/tasks/{session_id}"
EVENTS, ACTIONS, IMAGES = f"{TASK}/events", f"{TASK}/actions", f"{TASK}/images"
CALLBACK = "/feishu/callback"


def _pointer(*parts: str) -> str:
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


def _strict(node: Any) -> Any:
    """Every object schema that lists properties and says nothing of others refuses others."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for item in node:
            _strict(item)
    return node


@dataclass
class Answer:
    status: int
    headers: Mapping[str, str]
    body: bytes
    content_type: str

    @classmethod
    async def of(cls, response: aiohttp.ClientResponse) -> Answer:
        return cls(response.status, response.headers, await response.read(), response.content_type)


class Contract:
    """The document, and which (path, method, status) the real service was seen answering."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        strict = _strict(copy.deepcopy(dict(document)))
        resource = Resource.from_contents(strict, default_specification=DRAFT202012)
        self.registry: Registry[Any] = Registry().with_resource(DOC_URI, resource)
        self.seen: dict[tuple[str, str], set[str]] = defaultdict(set)

    def validator(self, pointer: str) -> Draft202012Validator:
        return Draft202012Validator(
            {"$ref": f"{DOC_URI}#{pointer}"}, registry=self.registry, format_checker=FormatChecker()
        )

    def responses(self, path: str, method: str) -> dict[str, Any]:
        responses: dict[str, Any] = self.document["paths"][path][method]["responses"]
        return responses

    def response_pointer(self, path: str, method: str, status: str) -> tuple[str, dict[str, Any]]:
        """Where the response object lives (following a shared response's $ref), and the object."""
        response = self.responses(path, method)[status]
        if "$ref" in response:
            name = response["$ref"].rsplit("/", 1)[1]
            return _pointer("components", "responses", name), self.document["components"]["responses"][name]
        return _pointer("paths", path, method, "responses", status), response

    def check(self, answer: Answer, path: str, method: str) -> Any:
        """Validate a real answer against the document; returns its JSON body."""
        status = str(answer.status)
        documented = self.responses(path, method)
        assert status in documented, f"{method.upper()} {path} answered {status}: {answer.body[:300]!r}"
        assert answer.content_type == "application/json", answer.content_type
        body = json.loads(answer.body)
        pointer, response = self.response_pointer(path, method, status)
        self.validator(pointer + _pointer("content", "application/json", "schema")).validate(body)
        for header in response.get("headers", {}):
            assert header in answer.headers, f"{status} lacks the documented {header} header"
        self.seen[(path, method)].add(status)
        return body

    def assert_provoked_all(self, path: str, method: str, *, except_: frozenset[str] = frozenset()) -> None:
        documented = set(self.responses(path, method))
        assert self.seen[(path, method)] == documented - except_, f"{method.upper()} {path}"


class Api:
    """The app in sandbox mode, and the requests that provoke each documented answer."""

    def __init__(self, client: TestClient[Any, Any], services: Services, contract: Contract) -> None:
        self.client = client
        self.services = services
        self.contract = contract

    async def call(self, method: str, template: str, url: str, *, auth: bool = True, **kwargs: Any) -> Any:
        headers = {**(AUTH if auth else {}), **kwargs.pop("headers", {})}
        async with self.client.request(method, url, headers=headers, **kwargs) as response:
            answer = await Answer.of(response)
        return self.contract.check(answer, template, method.lower())

    async def error(self, method: str, template: str, url: str, **kwargs: Any) -> str:
        """The error code of an answer (validated like any other)."""
        return str((await self.call(method, template, url, **kwargs))["error"])

    async def post_bytes(self, template: str, url: str, data: Any, content_type: str) -> str:
        """The error code answered to ``data`` sent as it is."""
        return await self.error("POST", template, url, data=data, headers={"Content-Type": content_type})

    async def raw(self, request: bytes, template: str, method: str) -> Any:
        """Send bytes as they are (a slow body): the answer comes before the body is complete."""
        reader, writer = await asyncio.open_connection(self.client.host, self.client.port)
        try:
            writer.write(request)
            await writer.drain()
            status = int((await asyncio.wait_for(reader.readline(), 5)).split()[1])
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1")
        finally:
            writer.close()
        headers = dict(line.split(": ", 1) for line in head.split("\r\n") if ": " in line)
        length = int(headers["Content-Length"])
        content_type = headers["Content-Type"].split(";")[0]
        answer = Answer(status, headers, await reader.readexactly(length), content_type)
        return self.contract.check(answer, template, method)

    async def create(self, **extra: Any) -> tuple[int, str]:
        body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER, **extra}
        created = await self.call("POST", TASKS, TASKS, json=body)
        return created["session_id"], created["message_id"]

    async def events(self, session_id: int, *events: Mapping[str, Any]) -> Any:
        url = f"/v1/tasks/{session_id}/events"
        return await self.call("POST", EVENTS, url, json={"events": list(events)})

    def keys(self) -> tuple[str, str]:
        feishu = self.services.settings.feishu
        assert feishu.encrypt_key is not None and feishu.verification_token is not None
        return feishu.encrypt_key.get_secret_value(), feishu.verification_token.get_secret_value()

    async def click(
        self,
        message_id: str,
        value: Mapping[str, Any],
        form: Mapping[str, Any] | None = None,
        *,
        age: float = 0.0,
        drop_action: bool = False,
    ) -> Any:
        encrypt_key, verification_token = self.keys()
        now = time.time() - age
        payload = card_action_payload(
            open_id=REQUESTER,
            message_id=message_id,
            value=value,
            form_value=form,
            verification_token=verification_token,
            now=now,
        )
        if drop_action:
            del payload["event"]["action"]
        body, headers = signed_request(payload, encrypt_key=encrypt_key, now=now)
        return await self.call("POST", CALLBACK, CALLBACK, auth=False, data=body, headers=headers)

    def break_database(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Loading a task not held in memory fails, as with the database down."""

        async def down(session_id: int) -> None:
            raise ConnectionError("database down")

        service = self.services.service
        assert service is not None
        monkeypatch.setattr(service.snapshots, "load", down)

    def slow_bodies(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The /v1 body deadline (10 s) shortened, so a slow body is cut off within the test."""
        for reader in (web_http.read_json, web_http.read_body, web_http.read_file_field):
            assert reader.__kwdefaults__ is not None
            monkeypatch.setitem(reader.__kwdefaults__, "timeout", SLOW_BODY_SECONDS)


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Contract(openapi_document())


@pytest.fixture
async def api(tmp_path: Path, aiohttp_client: Any, contract: Contract) -> AsyncIterator[Api]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'fp.db'}",
        feishu=FeishuSettings(),  # no credentials: sandbox mode
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=TOKEN),
        callback=CallbackSettings(body_timeout_seconds=SLOW_BODY_SECONDS, max_body_bytes=CALLBACK_BODY_LIMIT),
    )
    app = create_app(settings, registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(app)
    yield Api(client, app[SERVICES], contract)
    contract.seen.clear()


def _slow(path: str, content_type: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: 100\r\n\r\n"
    ).encode() + b"{"


# -- the document itself ---------------------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1() -> None:
    document = json.loads(openapi_json())
    assert document["openapi"] == "3.1.0"
    validate_openapi(document)


def test_the_committed_copy_is_what_the_code_generates() -> None:
    committed = (REPO / "docs" / "openapi.json").read_text(encoding="utf-8")
    assert committed == openapi_json(), "regenerate it: feishu-progress openapi > docs/openapi.json"


def test_every_event_type_is_a_schema_with_an_example(contract: Contract) -> None:
    schemas = contract.document["components"]["schemas"]
    mapping = schemas["Event"]["discriminator"]["mapping"]
    assert set(mapping) == set(EVENT_EXAMPLES)
    for kind, target in mapping.items():
        name = target.rsplit("/", 1)[1]
        assert schemas[name]["examples"] == [EVENT_EXAMPLES[kind]]
        contract.validator(_pointer("components", "schemas", name)).validate(EVENT_EXAMPLES[kind])
        parse_model(EventBatch, {"events": [EVENT_EXAMPLES[kind]]})  # the service takes it too


def test_every_request_example_is_valid_and_accepted_by_the_service(contract: Contract) -> None:
    models = {TASKS: CreateTaskRequest, EVENTS: EventBatch}
    checked = 0
    for path, model in models.items():
        content = contract.document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        validator = contract.validator(
            _pointer("paths", path, "post", "requestBody", "content", "application/json", "schema")
        )
        for example in content["examples"].values():
            validator.validate(example["value"])
            parse_model(model, example["value"])
            checked += 1
    assert checked >= 6


def test_every_response_example_is_valid(contract: Contract) -> None:
    checked = 0
    for path, item in contract.document["paths"].items():
        for method, operation in item.items():
            for status in operation["responses"]:
                pointer, response = contract.response_pointer(path, method, status)
                content = response["content"]["application/json"]
                validator = contract.validator(pointer + _pointer("content", "application/json", "schema"))
                for example in content.get("examples", {}).values():
                    validator.validate(example["value"])
                    checked += 1
    assert checked > 40


def test_the_strict_check_refuses_an_undocumented_field(contract: Contract) -> None:
    answer = Answer(
        201, {}, json.dumps({"session_id": 1, "message_id": "om_1", "extra": 1}).encode(), "application/json"
    )
    with pytest.raises(Exception, match="Additional properties"):
        contract.check(answer, TASKS, "post")


# -- every endpoint, every status it documents -----------------------------------------------------------


async def test_the_document_is_served_without_the_token(api: Api) -> None:
    async with api.client.get(OPENAPI_PATH) as response:
        assert response.status == 200
        assert await response.text() == openapi_json()
    answer = await api.call("GET", OPENAPI_PATH, OPENAPI_PATH, auth=False)
    assert answer["openapi"] == "3.1.0"
    assert (await api.call("GET", TASK, "/v1/tasks/1", auth=False))["error"] == "unauthorized"
    api.contract.assert_provoked_all(OPENAPI_PATH, "get")


async def test_create_task_answers_as_documented(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.create(title="contract")
    body = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}
    key = {"Idempotency-Key": "k-1"}
    first = await api.call("POST", TASKS, TASKS, json=body, headers=key)
    assert await api.call("POST", TASKS, TASKS, json=body, headers=key) == first
    assert await api.post_bytes(TASKS, TASKS, b"{", JSON) == "invalid_json"
    assert await api.error("POST", TASKS, TASKS, auth=False, json=body) == "unauthorized"
    await api.create(session_id=77)
    assert await api.error("POST", TASKS, TASKS, json={**body, "session_id": 77}) == "task_exists"
    huge = io.BytesIO(b'{"title": "' + b"x" * (8 * 1024 * 1024) + b'"}')
    assert await api.post_bytes(TASKS, TASKS, huge, JSON) == "body_too_large"
    assert await api.post_bytes(TASKS, TASKS, b"{}", "text/plain") == "unsupported_media_type"
    missing = await api.call("POST", TASKS, TASKS, json={"receive_id": "oc_1", "receive_id_type": "chat_id"})
    assert missing["field"] == "requester_open_id"
    bad_key = await api.call("POST", TASKS, TASKS, json=body, headers={"Idempotency-Key": "k" * 256})
    assert bad_key["field"] == "Idempotency-Key"
    api.slow_bodies(monkeypatch)
    assert (await api.raw(_slow(TASKS, JSON), TASKS, "post"))["error"] == "body_timeout"
    sandbox = api.services.sandbox
    assert sandbox is not None
    sandbox.state.faults.fail(1.0, status=400, endpoints=("send",))  # Feishu refuses the first card
    refused = await api.call("POST", TASKS, TASKS, json=body)
    assert refused["error"] == "unavailable" and refused["retry_after"] == 2
    api.contract.assert_provoked_all(TASKS, "post")


async def test_post_events_answers_as_documented(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    session_id, _ = await api.create()
    url = f"/v1/tasks/{session_id}/events"
    one = {"events": [EVENT_EXAMPLES["status"]]}
    assert (await api.events(session_id, *EVENT_EXAMPLES.values()))["accepted"] == len(EVENT_EXAMPLES)
    assert await api.post_bytes(EVENTS, url, b"[", JSON) == "invalid_json"
    assert await api.error("POST", EVENTS, url, auth=False, json=one) == "unauthorized"
    assert await api.error("POST", EVENTS, "/v1/tasks/999/events", json=one) == "unknown_task"
    huge = io.BytesIO(b'{"events": [{"type": "content", "text": "' + b"x" * (8 * 1024 * 1024) + b'"}]}')
    assert await api.post_bytes(EVENTS, url, huge, JSON) == "body_too_large"
    assert await api.post_bytes(EVENTS, url, b"{}", "text/plain") == "unsupported_media_type"
    bad = await api.call("POST", EVENTS, url, json={"events": [{"type": "tool_started", "name": "x"}]})
    assert bad["error"] == "invalid_event" and bad["field"] == "events[0].call_id"
    api.slow_bodies(monkeypatch)
    assert (await api.raw(_slow(url, JSON), EVENTS, "post"))["error"] == "body_timeout"
    await api.events(session_id, {"type": "finished", "status": "COMPLETED"})
    assert await api.error("POST", EVENTS, url, json=one) == "task_finished"
    api.break_database(monkeypatch)
    down = await api.call("POST", EVENTS, "/v1/tasks/998/events", json=one)
    assert down["error"] == "unavailable" and down["retry_after"] == 1
    # 429 too_busy needs a large body held in progress: tests/test_load_isolation.py provokes it.
    api.contract.assert_provoked_all(EVENTS, "post", except_=frozenset({"429"}))


async def test_get_task_answers_as_documented(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    session_id, message_id = await api.create(title="view")
    view = await api.call("GET", TASK, f"/v1/tasks/{session_id}")
    assert view["message_id"] == message_id and view["status"] == "RUNNING" and view["stop_reason"] is None
    assert (await api.call("GET", TASK, f"/v1/tasks/{session_id}", auth=False))["error"] == "unauthorized"
    assert (await api.call("GET", TASK, "/v1/tasks/not-a-number"))["error"] == "unknown_task"
    api.break_database(monkeypatch)
    assert (await api.call("GET", TASK, "/v1/tasks/998"))["error"] == "unavailable"
    api.contract.assert_provoked_all(TASK, "get")


async def test_actions_of_every_kind_and_the_errors_answer_as_documented(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id, message_id = await api.create()
    value = {"v": 1, "session_id": session_id}
    await api.events(session_id, EVENT_EXAMPLES["ask"], EVENT_EXAMPLES["approval"])
    answered = await api.click(
        message_id,
        {**value, "action": "answers", "ask_id": "ask-1"},
        {"q0_0": "1", "q0_1": ["0"], "q0_1_other": "more"},
    )
    assert answered["toast"]["type"] == "success"
    always = await api.click(message_id, {**value, "action": "approve_always", "approval_id": "ap-1"})
    assert always["toast"]["type"] == "success"
    await api.click(message_id, {**value, "action": "dislike"})
    await api.click(message_id, {**value, "action": "cancel"})
    await api.events(session_id, {"type": "finished", "status": "FAILED", "error": "boom"})
    await api.click(message_id, {**value, "action": "retry"})
    url = f"/v1/tasks/{session_id}/actions"
    page = await api.call("GET", ACTIONS, url, params={"after": "0", "wait": "5"})
    assert [action["kind"] for action in page["actions"]] == [
        "answers",
        "approval",
        "dislike",
        "cancel",
        "retry",
    ]
    assert page["actions"][0]["payload"]["answers"][1] == {
        "question": "验收时想看到什么?",
        "selected_labels": ["本地 demo"],
        "custom_input": "more",
    }
    assert page["actions"][1]["payload"] == {
        "approval_id": "ap-1",
        "tool_name": "mcp__github__create_pull_request",
        "approved": True,
        "always": True,
    }
    later = await api.call("GET", ACTIONS, url, params={"after": str(page["cursor"])})
    assert later == {"actions": [], "cursor": page["cursor"]}
    assert (await api.call("GET", ACTIONS, url, auth=False))["error"] == "unauthorized"
    assert (await api.call("GET", ACTIONS, "/v1/tasks/999/actions"))["error"] == "unknown_task"
    assert (await api.call("GET", ACTIONS, url, params={"wait": "61"}))["error"] == "invalid_query"
    assert (await api.call("GET", ACTIONS, url, params={"after": "x"}))["error"] == "invalid_query"
    api.break_database(monkeypatch)
    assert (await api.call("GET", ACTIONS, "/v1/tasks/998/actions"))["error"] == "unavailable"
    api.contract.assert_provoked_all(ACTIONS, "get")


async def test_upload_image_answers_as_documented(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    session_id, _ = await api.create()
    url = f"/v1/tasks/{session_id}/images"

    def form(data: bytes, field: str = "image") -> aiohttp.FormData:
        built = aiohttp.FormData()
        built.add_field(field, io.BytesIO(data), filename="x.png", content_type="application/octet-stream")
        return built

    uploaded = await api.call("POST", IMAGES, url, data=form(tiny_png()))
    assert uploaded["mime"] == "image/png" and uploaded["bytes"] == len(tiny_png())
    garbled = b"this is not a part\r\n"
    assert (
        await api.post_bytes(IMAGES, url, garbled, "multipart/form-data; boundary=b") == "invalid_multipart"
    )
    assert await api.error("POST", IMAGES, url, auth=False, data=form(tiny_png())) == "unauthorized"
    assert await api.error("POST", IMAGES, "/v1/tasks/999/images", data=form(tiny_png())) == "unknown_task"
    big = tiny_png() + b"\x00" * (10 * 1024 * 1024)
    assert await api.error("POST", IMAGES, url, data=form(big)) == "body_too_large"
    assert await api.post_bytes(IMAGES, url, b"{}", JSON) == "unsupported_media_type"
    assert await api.error("POST", IMAGES, url, data=form(b"#!/bin/sh\n")) == "invalid_image"
    assert (await api.call("POST", IMAGES, url, data=form(tiny_png(), "file")))["field"] == "image"
    api.slow_bodies(monkeypatch)
    slow = _slow(url, "multipart/form-data; boundary=b")
    assert (await api.raw(slow, IMAGES, "post"))["error"] == "body_timeout"
    await api.events(session_id, {"type": "finished", "status": "COMPLETED"})
    assert await api.error("POST", IMAGES, url, data=form(tiny_png())) == "task_finished"
    api.break_database(monkeypatch)
    assert await api.error("POST", IMAGES, "/v1/tasks/998/images", data=form(tiny_png())) == "unavailable"
    # 429 too_busy needs every upload slot held: tests/test_load_isolation.py provokes it.
    api.contract.assert_provoked_all(IMAGES, "post", except_=frozenset({"429"}))


async def test_the_feishu_callback_answers_as_documented(api: Api) -> None:
    session_id, message_id = await api.create()
    value = {"v": 1, "action": "dislike", "session_id": session_id}
    answer = await api.click(message_id, value)
    # A CardKit card (the default transport) gets no card in the answer: the change is written to it.
    assert answer["toast"]["type"] == "success" and "card" not in answer
    encrypt_key, verification_token = api.keys()
    check = {"type": "url_verification", "challenge": "c-1", "token": verification_token}
    body, headers = signed_request(check, encrypt_key=encrypt_key, now=time.time())
    echoed = await api.call("POST", CALLBACK, CALLBACK, auth=False, data=body, headers=headers)
    assert echoed == {"challenge": "c-1"}
    assert (await api.click(message_id, value, drop_action=True))["error"] == "callback_rejected"
    unsigned, _ = signed_request({"schema": "2.0"}, encrypt_key=None, now=time.time())
    refused = await api.call("POST", CALLBACK, CALLBACK, auth=False, data=unsigned, headers=JSON_TYPE)
    assert refused["message"] == "missing signature headers"
    assert "stale" in (await api.click(message_id, value, age=3600))["message"]
    too_big = b"{" + b" " * CALLBACK_BODY_LIMIT + b"}"
    assert await api.post_bytes(CALLBACK, CALLBACK, too_big, JSON) == "body_too_large"
    assert await api.post_bytes(CALLBACK, CALLBACK, b"{}", "text/plain") == "unsupported_media_type"
    assert (await api.raw(_slow(CALLBACK, JSON), CALLBACK, "post"))["error"] == "body_timeout"
    api.contract.assert_provoked_all(CALLBACK, "post")


async def test_any_other_method_answers_405_with_the_error_body(api: Api, contract: Contract) -> None:
    validator = contract.validator(_pointer("components", "schemas", "ErrorBody"))
    for method, path in (("GET", "/v1/tasks"), ("DELETE", "/v1/tasks/1"), ("PUT", "/v1/tasks/1/events")):
        async with api.client.request(method, path, headers=AUTH) as response:
            assert response.status == 405
            body = await response.json()
        validator.validate(body)
        assert body["error"] == "method_not_allowed"


async def test_the_document_names_exactly_the_routes_the_app_serves(api: Api) -> None:
    """Routes are declared in web/api.py and documented in web/openapi.py: this ties the two lists.

    The sandbox preview (``/sandbox``, ``/_sandbox``) is left out on purpose, as README says; so are
    aiohttp's automatic HEAD routes.
    """
    served = {
        (route.resource.canonical, route.method.lower())
        for route in api.client.app.router.routes()
        if route.resource is not None
        and route.method not in ("HEAD", "*")
        and not route.resource.canonical.startswith(("/sandbox", "/_sandbox"))
        and route.resource.canonical != "/"
    }
    documented = {
        (path, method) for path, operations in openapi_document()["paths"].items() for method in operations
    }
    assert served == documented
