"""OpenTelemetry (the ``[otel]`` extra): a span per runtime request and per Open API write, the runtime's
``traceparent`` carried to the write that shows its events, over the real HTTP path against the sandbox,
collected by the SDK's in-memory exporter; and nothing at all without a tracer provider or the extra.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.cluster.forward import FORWARDED_HEADER, Forwarder
from feishu_progress.config import (
    CardSettings,
    Settings,
)
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.tracing import MAX_LINKS, CardTraces, provider_from_env, traces_endpoint
from feishu_progress.web.http import serving
from tests.conftest import sqlite_url
from tests.rigs import API_TOKEN, APP_SECRET, AUTH, Client, app_settings_for, eventually


class Started(SpanProcessor):
    """The spans started so far (the in-memory exporter only sees them end)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)


class Traces:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.started = Started()
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.started)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def ended(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    async def wait_for(
        self, name: str, match: Callable[[ReadableSpan], bool] = lambda span: True
    ) -> ReadableSpan:
        found = await eventually(
            lambda: [span for span in self.ended(name) if match(span)], timeout=15, what=f"a {name!r} span"
        )
        return found[0]


def runtime_parent(n: int) -> tuple[dict[str, str], int, int]:
    """A runtime's traceparent header (sampled), its trace id and its span id."""
    trace_id, span_id = 0xA0000000000000000000000000000000 + n, 0xB000000000000000 + n
    return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01", **AUTH}, trace_id, span_id


@pytest.fixture
def traces() -> Traces:
    return Traces()


def settings_for(sandbox: RunningSandbox, tmp_path: Path, transport: str) -> Settings:
    return app_settings_for(
        sandbox, sqlite_url(tmp_path / "traces.db"), _env_file=None, card=CardSettings(transport=transport)
    )


async def traced_client(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces, transport: str
) -> Client:
    app = create_app(
        settings_for(sandbox, tmp_path, transport),
        registry=CollectorRegistry(),
        tracer_provider=traces.provider,
    )
    client: Client = await aiohttp_client(app)
    return client


async def create_task(client: Client, headers: dict[str, str]) -> tuple[int, str]:
    body = {"receive_id": "oc_t", "receive_id_type": "chat_id", "requester_open_id": "ou_t", "title": "t"}
    response = await client.post("/v1/tasks", json=body, headers=headers)
    assert response.status == 201, await response.text()
    created = await response.json()
    return created["session_id"], created["message_id"]


async def post_events(client: Client, session_id: int, headers: dict[str, str], *events: Any) -> None:
    response = await client.post(
        f"/v1/tasks/{session_id}/events", json={"events": list(events)}, headers=headers
    )
    assert response.status == 202, await response.text()


def delta(text: str) -> dict[str, str]:
    return {"type": "content_delta", "text": text}


def context_of(span: ReadableSpan) -> SpanContext:
    assert span.context is not None
    return span.context


async def test_a_request_and_the_first_card_it_sends_are_one_trace_under_the_runtimes_span(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces
) -> None:
    client = await traced_client(aiohttp_client, sandbox, tmp_path, traces, "patch")
    headers, trace_id, runtime_span = runtime_parent(1)
    _, message_id = await create_task(client, headers)
    server = await traces.wait_for("POST /v1/tasks")
    assert server.kind is SpanKind.SERVER and server.parent is not None
    assert (context_of(server).trace_id, server.parent.span_id) == (trace_id, runtime_span)
    assert server.attributes is not None and server.attributes["http.response.status_code"] == 201
    send = await traces.wait_for("POST /open-apis/im/v1/messages")
    assert send.kind is SpanKind.CLIENT and send.parent is not None
    assert send.parent.span_id == context_of(server).span_id and context_of(send).trace_id == trace_id
    assert send.attributes is not None
    assert {
        "feishu.api": "send",
        "feishu.app": "default",
        "feishu.result": "ok",
        "http.request.method": "POST",
        "http.response.status_code": 200,
        "server.address": "127.0.0.1",
    }.items() <= dict(send.attributes).items()
    assert message_id not in str(dict(send.attributes))  # a send has no card yet: no id to carry
    # Nothing of the request's secrets is on any span.
    for span in traces.exporter.get_finished_spans():
        assert API_TOKEN not in str(span.attributes) and APP_SECRET not in str(span.attributes)


async def test_a_write_is_in_the_trace_of_the_newest_batch_it_shows_and_links_the_others(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces
) -> None:
    client = await traced_client(aiohttp_client, sandbox, tmp_path, traces, "patch")
    session_id, message_id = await create_task(client, AUTH)
    patch = "PATCH /open-apis/im/v1/messages/{message_id}"
    sandbox.state.faults.hang(1, endpoints=("patch",))  # the write of batch B hangs...
    first, _, _ = runtime_parent(2)
    await post_events(client, session_id, first, delta("one "))
    await eventually(lambda: patch in traces.started.names, timeout=10)
    second, _, _ = runtime_parent(3)  # ...while two more batches arrive: the next write shows all three
    newest, newest_trace, _ = runtime_parent(4)
    await post_events(client, session_id, second, delta("two "))
    await post_events(client, session_id, newest, delta("three"))
    sandbox.state.faults.release_hangs()  # the hung PATCH ends with a 504

    batches = {
        name: context_of(span)
        for name, span in zip(
            ("B", "C", "D"), traces.ended("POST /v1/tasks/{session_id}/events"), strict=True
        )
    }
    failed = await traces.wait_for(patch, lambda span: span.status.status_code is StatusCode.ERROR)
    assert failed.parent is not None and failed.parent.span_id == batches["B"].span_id
    assert failed.attributes is not None and failed.attributes["http.response.status_code"] == 504
    assert failed.attributes["feishu.result"] == "error" and failed.attributes["error.type"] == "504"
    shown = await traces.wait_for(patch, lambda span: span.status.status_code is not StatusCode.ERROR)
    assert shown.parent is not None and shown.parent.span_id == batches["D"].span_id
    assert context_of(shown).trace_id == newest_trace
    # B's write failed, so B is linked again by the write that did show it; D is its parent, not a link.
    assert sorted(link.context.span_id for link in shown.links) == sorted(
        (batches["B"].span_id, batches["C"].span_id)
    )
    assert shown.attributes is not None and shown.attributes["feishu.message_id"] == message_id
    assert "three" in str(sandbox.state.messages[message_id].card)
    metrics = client.app[SERVICES].metrics
    writes = "fp_open_api_writes_total"
    assert metrics.value(writes, {"app": "default", "api": "patch", "result": "error"}) == 1
    assert metrics.value(writes, {"app": "default", "api": "patch", "result": "ok"}) >= 1
    assert metrics.value(writes, {"app": "default", "api": "send", "result": "ok"}) == 1


async def test_cardkit_writes_join_the_trace_of_the_batch_they_stream(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces
) -> None:
    client = await traced_client(aiohttp_client, sandbox, tmp_path, traces, "cardkit")
    created, create_trace, _ = runtime_parent(5)
    session_id, _ = await create_task(client, created)
    entity = await traces.wait_for("POST /open-apis/cardkit/v1/cards")
    assert context_of(entity).trace_id == create_trace  # the entity is made inside the create request
    batch, batch_trace, _ = runtime_parent(6)
    await post_events(
        client, session_id, batch, {"type": "status", "status": "RUNNING", "round": 1}, delta("streamed")
    )
    server = await traces.wait_for(
        "POST /v1/tasks/{session_id}/events", lambda span: context_of(span).trace_id == batch_trace
    )
    # The entity was just created streaming: the text streams into its answer element at once, the
    # new round's panels follow in a whole write; both are in the batch's trace.
    streamed = await traces.wait_for(
        "PUT /open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content",
        lambda span: span.parent is not None and span.parent.span_id == context_of(server).span_id,
    )
    assert streamed.attributes is not None and streamed.attributes["feishu.api"] == "card_content"
    written = await traces.wait_for("PUT /open-apis/cardkit/v1/cards/{card_id}")
    assert written.parent is not None and written.parent.span_id == context_of(server).span_id
    assert written.attributes is not None and written.attributes["feishu.api"] == "card_update"
    card_ids = {message.card_id for message in sandbox.state.messages.values()}
    assert written.attributes["feishu.card_id"] in card_ids


async def test_a_refused_request_is_a_span_with_its_status_and_nothing_is_noted(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces
) -> None:
    client = await traced_client(aiohttp_client, sandbox, tmp_path, traces, "patch")
    session_id, message_id = await create_task(client, AUTH)
    headers, _, _ = runtime_parent(7)
    response = await client.post(
        f"/v1/tasks/{session_id}/events", json={"events": [{"type": "nonsense"}]}, headers=headers
    )
    assert response.status == 422
    span = await traces.wait_for("POST /v1/tasks/{session_id}/events")
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 422
    assert span.attributes["fp.session_id"] == session_id
    assert client.app[SERVICES].tracing is not None
    assert client.app[SERVICES].tracing.cards.take(message_id) == (None, [])


def test_card_traces_keep_the_newest_batch_as_parent_and_give_failed_writes_back() -> None:
    def ctx(n: int) -> SpanContext:
        return SpanContext(1, n, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    cards = CardTraces(max_cards=2)
    assert cards.take("om_1") == (None, [])
    cards.note(["om_1", "card_1"], ctx(1))
    cards.note(["om_1"], ctx(2))
    assert cards.take("om_1") == (ctx(2), [ctx(1), ctx(2)])
    assert cards.take("om_1") == (ctx(2), [])  # shown: a later write stays in the trace, links nothing
    cards.note(["om_1"], ctx(3))
    parent, taken = cards.take("om_1")
    cards.give_back("om_1", taken)  # that write failed
    cards.note(["om_1"], ctx(4))
    assert cards.take("om_1") == (ctx(4), [ctx(3), ctx(4)])
    for n in range(100):
        cards.note(["om_1"], ctx(10 + n))
    assert len(cards.take("om_1")[1]) == MAX_LINKS
    cards.note(["om_2"], ctx(5))
    cards.note(["om_3"], ctx(6))  # bounded: the least recently used card is forgotten
    assert cards.take("card_1") == (None, [])
    assert parent == ctx(3)


def test_the_standard_variables_choose_the_exporter(caplog: pytest.LogCaptureFixture) -> None:
    assert traces_endpoint({}) is None
    assert traces_endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    own = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}
    assert traces_endpoint(own) == "http://t/x"
    assert provider_from_env({}, instance_id="i") is None
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    assert provider_from_env(off, instance_id="i") is None
    grpc = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert provider_from_env(grpc, instance_id="i") is None
    assert "OTLP/HTTP only" in caplog.text


async def test_spans_are_exported_by_otlp_http_to_the_configured_endpoint(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path
) -> None:
    received: list[ExportTraceServiceRequest] = []

    async def collector(request: web.Request) -> web.Response:
        parsed = ExportTraceServiceRequest()
        parsed.ParseFromString(await request.read())
        received.append(parsed)
        return web.Response(status=200, content_type="application/x-protobuf")

    otlp = web.Application()
    otlp.router.add_post("/v1/traces", collector)
    async with serving(otlp) as collector_url:
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector_url, "OTEL_SERVICE_NAME": "fp-test"}
        provider = provider_from_env(environ, instance_id="fp-traces-1")
        assert provider is not None
        app = create_app(
            settings_for(sandbox, tmp_path, "patch"), registry=CollectorRegistry(), tracer_provider=provider
        )
        client: Client = await aiohttp_client(app)
        await create_task(client, runtime_parent(8)[0])
        await asyncio.to_thread(provider.force_flush)
        provider.shutdown()
    spans = [
        (span.name, resource.resource)
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = {name for name, _ in spans}
    assert {"POST /v1/tasks", "POST /open-apis/im/v1/messages"} <= names
    attributes = {item.key: item.value.string_value for item in spans[0][1].attributes}
    assert attributes["service.name"] == "fp-test" and attributes["service.instance.id"] == "fp-traces-1"


NO_OTEL_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys
    sys.modules["opentelemetry"] = None  # any import of it fails, as without the [otel] extra
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)

    import aiohttp
    from prometheus_client import CollectorRegistry
    from feishu_progress.app import create_app
    from feishu_progress.config import AdminSettings, ApiSettings, HttpSettings, Settings
    from feishu_progress.tracing import provider_from_env
    from feishu_progress.web.http import serving

    async def main() -> None:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
        provider = provider_from_env(env, instance_id="x")
        assert provider is None
        settings = Settings(
            _env_file=None,
            database_url="sqlite+aiosqlite:///" + sys.argv[1],
            http=HttpSettings(host="127.0.0.1", port=0),
            admin=AdminSettings(host="127.0.0.1", port=0),
            api=ApiSettings(token="t"),
        )
        headers = {"Authorization": "Bearer t", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
        body = {"receive_id": "oc", "receive_id_type": "chat_id", "requester_open_id": "ou", "title": "t"}
        app = create_app(settings, registry=CollectorRegistry(), tracer_provider=provider)
        async with serving(app) as url:
            async with aiohttp.ClientSession() as http:
                async with http.post(url + "/v1/tasks", json=body, headers=headers) as created:
                    assert created.status == 201, await created.text()
                    session_id = (await created.json())["session_id"]
                events = {"events": [{"type": "finished", "status": "COMPLETED", "content": "done"}]}
                events_url = f"{url}/v1/tasks/{session_id}/events"
                async with http.post(events_url, json=events, headers=headers) as r:
                    assert r.status == 202, await r.text()
        loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry."))
        print("otel modules:", loaded)
        print("served without opentelemetry")

    asyncio.run(main())
    """
)


def test_the_app_runs_and_imports_nothing_of_opentelemetry_without_the_extra(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", NO_OTEL_SCRIPT, str(tmp_path / "no-otel.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "served without opentelemetry" in run.stdout
    assert "otel modules: []" in run.stdout
    assert "the [otel] extra is not installed" in run.stdout  # said once, serving went on


async def test_a_batch_forwarded_to_its_cards_writer_keeps_the_runtimes_traceparent(
    aiohttp_client: Any,
) -> None:
    """Cluster mode: the writer's span of a forwarded batch joins the runtime's trace."""
    seen: list[dict[str, str]] = []

    async def writer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"accepted": 1}, status=202)

    owner = web.Application()
    owner.router.add_post("/v1/tasks/{session_id}/events", writer)
    forwarder = Forwarder("fp-a", request_timeout=5, click_timeout=1)
    await forwarder.open()
    async with serving(owner) as owner_url:

        async def accept(request: web.Request) -> web.Response:
            return await forwarder.request(request, owner_url)

        front = web.Application()
        front.router.add_post("/v1/tasks/{session_id}/events", accept)
        client: Client = await aiohttp_client(front)
        headers, trace_id, span_id = runtime_parent(9)
        answered = await client.post("/v1/tasks/1/events", json={"events": []}, headers=headers)
        assert answered.status == 202
    await forwarder.close()
    assert seen[0]["traceparent"] == f"00-{trace_id:032x}-{span_id:016x}-01"
    assert seen[0][FORWARDED_HEADER] == "fp-a"


async def test_a_path_no_route_matches_is_named_by_its_method_alone(
    aiohttp_client: Any, sandbox: RunningSandbox, tmp_path: Path, traces: Traces
) -> None:
    client = await traced_client(aiohttp_client, sandbox, tmp_path, traces, "patch")
    made_up = "/v1/" + "x" * 1000
    assert (await client.get(made_up, headers=AUTH)).status == 404
    span = await traces.wait_for("GET")
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 404
    assert "http.route" not in span.attributes and len(str(span.attributes["url.path"])) == 256
