"""OpenTelemetry traces (the optional extra ``[otel]``): a span per runtime request, one per Open API write,
and the runtime's ``traceparent`` carried to the write that shows its events.

Off unless ``create_app`` is handed a tracer provider: ``serve`` builds one from the standard variables
(``provider_from_env``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, OTLP over
HTTP/protobuf), an embedding program or a test passes its own. Off, this module imports nothing from
opentelemetry, no middleware is installed and a write is only counted (``feishu/observe.py``).

How a batch's trace reaches its card. A write is not made by the request that posted the events: the
scheduler writes each card later, one write in flight, and one write shows every batch applied before it
(the newest state wins). So the events request, once answered 202, notes its span's context under the
card's message id and CardKit card id (``CardTraces``); a write of that card then starts its span with
**the newest noted batch as parent** (the write shows that batch's state: it belongs in that trace) and
**links to the other batches it is the first successful write to show** (coalesced batches: one write,
many causes — the OpenTelemetry pattern for batch processing). A write that fails gives its batches back,
so the write that finally shows them links them. Writes made inside a request (the first card of
``POST /v1/tasks``, an image upload) are children of that request's span, as contextvars carry it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from feishu_progress.bounded import BoundedCache
from feishu_progress.feishu.observe import OK, WriteCall, WriteResult
from feishu_progress.services import SERVICES
from feishu_progress.web.http import parse_id

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Span, SpanContext
    from opentelemetry.trace import TracerProvider as ApiTracerProvider


log = logging.getLogger(__name__)

SERVICE_NAME = "feishu-progress"
RUNTIME_PREFIX = "/v1/"  # the runtime API: each of its requests is a span
EVENTS_ROUTE = "/v1/tasks/{session_id}/events"
# Cards whose batches are held for their next write (a CardKit card holds two keys: message and entity).
# An evicted card's next write is only unlinked; every entry is a few small objects.
MAX_CARDS = 16_384
# Batches one write links at most: Feishu paces a card to ≤ 5 writes/s, so a write coalesces a few
# batches; a card whose writes fail for a while keeps its newest ones.
MAX_LINKS = 32
TRACES_PATH = "/v1/traces"
MAX_PATH_CHARS = 256  # a request's path on its span: ids are short, a made-up path is cut
OTLP_HTTP = "http/protobuf"


def provider_from_env(environ: Mapping[str, str], *, instance_id: str) -> TracerProvider | None:
    """An SDK tracer provider exporting by OTLP/HTTP, when the standard variables ask for one; else None.

    None also when ``[otel]`` is not installed or the protocol asked for is not http/protobuf (both
    logged once: serving goes on without traces).
    """
    endpoint = traces_endpoint(environ)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol not in (None, "", OTLP_HTTP):
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s: feishu-progress exports traces over OTLP/HTTP only; set it to "
            "%s (the collector's port 4318): no traces are sent",
            protocol,
            OTLP_HTTP,
        )
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the [otel] extra is not installed "
            "(pip install 'feishu-progress[otel]'): no traces are sent"
        )
        return None
    resource = Resource.create(
        {
            "service.name": environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME,
            "service.instance.id": instance_id,
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    log.info("traces exported by OTLP/HTTP to %s", endpoint)
    return provider


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where spans go, as the OTLP exporter reads the variables (the signal's own endpoint first)."""
    own = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if own:
        return own
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + TRACES_PATH if base else None


@dataclass(slots=True)
class _Batches:
    """One card's noted batches: the newest (every later write's parent) and those no write showed yet."""

    newest: SpanContext
    unshown: list[SpanContext] = field(default_factory=list)


class CardTraces:
    """The span contexts of event batches, by the message id and card id of the card that shows them."""

    def __init__(self, max_cards: int = MAX_CARDS) -> None:
        self._cards: BoundedCache[str, _Batches] = BoundedCache(max_cards)

    def note(self, keys: Iterable[str], batch: SpanContext) -> None:
        """A batch applied to the card known by ``keys``: its next write shows it."""
        for key in keys:
            held = self._cards.get(key)
            if held is None:
                self._cards.put(key, _Batches(batch, [batch]))
                continue
            held.newest = batch
            held.unshown = [*held.unshown, batch][-MAX_LINKS:]

    def take(self, key: str) -> tuple[SpanContext | None, list[SpanContext]]:
        """For a write of ``key``: its parent (the newest batch) and the batches it is first to show."""
        held = self._cards.get(key)
        if held is None:
            return None, []
        taken, held.unshown = held.unshown, []
        return held.newest, taken

    def give_back(self, key: str, taken: list[SpanContext]) -> None:
        """A write failed: the batches it took are still to be shown."""
        held = self._cards.get(key)
        if held is not None and taken:
            held.unshown = [*taken, *held.unshown][-MAX_LINKS:]


class Tracing:
    """The tracer, the request middleware, the write spans and the card traces of one running app."""

    def __init__(self, provider: ApiTracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = provider.get_tracer("feishu_progress")
        self.cards = CardTraces()
        # W3C traceparent/tracestate only, whatever OTEL_PROPAGATORS says: the contract is traceparent.
        self._propagator = TraceContextTextMapPropagator()

    def middleware(self) -> Middleware:
        """A server span per runtime API request, its parent the request's ``traceparent``."""
        from opentelemetry.trace import SpanKind

        @web.middleware
        async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith(RUNTIME_PREFIX):
                return await handler(request)
            route = _route(request)
            with self.tracer.start_as_current_span(
                f"{request.method} {route}" if route else request.method,
                context=self._propagator.extract(request.headers),
                kind=SpanKind.SERVER,
                attributes=_request_attributes(request, route),
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                response = await _answered(span, handler, request)
                if route == EVENTS_ROUTE and response.status == 202:
                    self.cards.note(_card_keys(request), span.get_span_context())
                return response

        return traced

    def write_spans(self, app: str, base_url: str) -> WriteTracer:
        """The client spans of ``app``'s writes (``feishu/observe.py`` calls them)."""
        return WriteTracer(self, app, base_url)


class WriteTracer:
    """Starts the span of one Open API write, with its parent and links (module docstring)."""

    def __init__(self, tracing: Tracing, app: str, base_url: str) -> None:
        split = urlsplit(base_url)
        port = split.port or (443 if split.scheme == "https" else 80)
        self._tracing = tracing
        self._server: dict[str, str | int] = {
            "server.address": split.hostname or "",
            "server.port": port,
            "feishu.app": app,
        }

    def start(self, call: WriteCall) -> ClientSpan:
        from opentelemetry import trace

        context: Context | None = None
        links: list[Link] = []
        taken: list[SpanContext] = []
        if not trace.get_current_span().get_span_context().is_valid and call.key is not None:
            parent, taken = self._tracing.cards.take(call.key)
            if parent is not None:
                context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            links = [trace.Link(batch) for batch in taken if batch != parent]
        span = self._tracing.tracer.start_span(
            f"{call.method} {call.route}",
            context=context,
            kind=trace.SpanKind.CLIENT,
            attributes={**self._server, **_write_attributes(call)},
            links=links,
        )
        return ClientSpan(span, self._tracing.cards, call.key, taken)


class ClientSpan:
    """One write's span: what Feishu answered, how it ended; a failed write gives its batches back."""

    def __init__(self, span: Span, cards: CardTraces, key: str | None, taken: list[SpanContext]) -> None:
        self._span, self._cards, self._key, self._taken = span, cards, key, taken

    def answered(self, http_status: int, log_id: str) -> None:
        self._span.set_attribute("http.response.status_code", http_status)
        if log_id:
            self._span.set_attribute("feishu.log_id", log_id)

    def end(self, outcome: WriteResult) -> None:
        from opentelemetry.trace import StatusCode

        span = self._span
        span.set_attribute("feishu.result", outcome.result)
        if outcome.code is not None:
            span.set_attribute("feishu.code", outcome.code)
        if outcome.log_id:
            span.set_attribute("feishu.log_id", outcome.log_id)
        if outcome.result != OK:
            kind = str(outcome.code) if outcome.code is not None else type(outcome.error).__name__
            span.set_attribute("error.type", kind)
            span.set_status(StatusCode.ERROR, f"{outcome.result}: {kind}")
            if self._key is not None:
                self._cards.give_back(self._key, self._taken)
        span.end()


def _route(request: web.Request) -> str | None:
    """The matched route (``/v1/tasks/{session_id}``); None for a path no route matched, whose span is
    named by its method alone (a span name must not carry whatever path a client made up)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None


def _request_attributes(request: web.Request, route: str | None) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "http.request.method": request.method,
        "url.path": request.path[:MAX_PATH_CHARS],
        "url.scheme": request.scheme,
    }
    if route is not None:
        attributes["http.route"] = route
    session_id = parse_id(request.match_info.get("session_id", ""))
    if session_id is not None:
        attributes["fp.session_id"] = session_id
    agent = request.headers.get("User-Agent")
    if agent:
        attributes["user_agent.original"] = agent[:256]
    return attributes


async def _answered(span: Span, handler: Handler, request: web.Request) -> web.StreamResponse:
    """The handler's response, its status on the span (an exception's too, then raised again)."""
    from opentelemetry.trace import StatusCode

    try:
        response = await handler(request)
    except web.HTTPException as exc:  # aiohttp's own answers (no route, method not allowed)
        span.set_attribute("http.response.status_code", exc.status)
        raise
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__name__)
        span.set_status(StatusCode.ERROR, type(exc).__name__)
        raise
    span.set_attribute("http.response.status_code", response.status)
    if response.status >= 500:
        span.set_attribute("error.type", str(response.status))
        span.set_status(StatusCode.ERROR)
    return response


def _card_keys(request: web.Request) -> list[str]:
    """The message id and CardKit card id of the task an events request was applied to (held here)."""
    session_id = parse_id(request.match_info.get("session_id", ""))
    services = request.app.get(SERVICES)  # None: the app has not finished starting
    task = None if services is None or session_id is None else services.service.registry.get(session_id)
    if task is None:  # cluster mode: forwarded to its writer, or logged for it
        return []
    return [key for key in (task.state.message_id, task.state.card_id) if key]


def _write_attributes(call: WriteCall) -> dict[str, str]:
    attributes = {"http.request.method": call.method, "url.template": call.route, "feishu.api": call.api}
    if call.key is not None:
        attributes["feishu.card_id" if call.api.startswith("card_") else "feishu.message_id"] = call.key
    return attributes
