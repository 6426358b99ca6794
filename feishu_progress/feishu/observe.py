"""What the Open API client reports about each write: a count by app, API and result, and a span.

``FeishuClient`` calls ``WriteObserver.write`` around every write request (never the token fetch): the
one place writes are observed. The count is ``fp_open_api_writes_total{app, api, result}``; the span
exists only when tracing is on (``tracing.py``, the optional ``[otel]`` extra and a tracer provider):
otherwise ``spans`` is None and a write costs one counter increment.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from feishu_progress.errors import FeishuAPIError
from feishu_progress.metrics import Labelled

if TYPE_CHECKING:
    from feishu_progress.metrics import Metrics
    from feishu_progress.tracing import Tracing

OK, ERROR, NO_ANSWER = "ok", "error", "no_answer"


@dataclass(frozen=True, slots=True)
class WriteCall:
    """One write as the client starts it. ``key``: the message or card entity it writes, when it has one."""

    api: str  # the budget's name (config.ApiLimits): send, reply, patch, image, card_*
    method: str
    route: str  # the path with its ids as placeholders (url.template)
    key: str | None


@dataclass(frozen=True, slots=True)
class WriteResult:
    """How it ended: ``result`` (ok / error / no_answer), and what Feishu said when it answered."""

    result: str
    http_status: int | None = None
    code: int | None = None
    log_id: str = ""
    error: BaseException | None = None


class WriteSpan(Protocol):
    def answered(self, http_status: int, log_id: str) -> None: ...

    def end(self, outcome: WriteResult) -> None: ...


class WriteSpans(Protocol):
    """The tracing side: a client span per write (``tracing.WriteTracer``)."""

    def start(self, call: WriteCall) -> WriteSpan: ...


class ObservedWrite:
    """The context of one write request: counts it on exit, and ends its span when there is one."""

    __slots__ = ("_call", "_http_status", "_log_id", "_observer", "_span")

    def __init__(self, call: WriteCall, observer: WriteObserver, span: WriteSpan | None) -> None:
        self._call = call
        self._observer = observer
        self._span = span
        self._http_status: int | None = None
        self._log_id = ""

    def __enter__(self) -> ObservedWrite:
        return self

    def answered(self, http_status: int, log_id: str) -> None:
        """Feishu answered (any status): what a span and a support ticket want to know."""
        self._http_status, self._log_id = http_status, log_id
        if self._span is not None:
            self._span.answered(http_status, log_id)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        outcome = _outcome(exc, self._http_status, self._log_id)
        self._observer.count(self._call.api, outcome.result)
        if self._span is not None:
            self._span.end(outcome)


class WriteObserver:
    """One app's write observer: its counter view, and its spans when tracing is on."""

    def __init__(self, counts: Labelled, spans: WriteSpans | None = None) -> None:
        self._counts = counts
        self._spans = spans
        # The counter's child per (api, result), looked up once: labels() is most of a count's cost.
        self._children: dict[tuple[str, str], Any] = {}

    def write(self, api: str, method: str, route: str, key: str | None) -> ObservedWrite:
        call = WriteCall(api, method, route, key)
        return ObservedWrite(call, self, None if self._spans is None else self._spans.start(call))

    def count(self, api: str, result: str) -> None:
        child = self._children.get((api, result))
        if child is None:
            child = self._children[api, result] = self._counts.labels(api=api, result=result)
        child.inc()


def write_observer(app: str, base_url: str, metrics: Metrics, tracing: Tracing | None) -> WriteObserver:
    """The observer of ``app``'s client (``base_url``: where its writes go, a span's server address)."""
    spans = None if tracing is None else tracing.write_spans(app, base_url)
    return WriteObserver(metrics.for_app(app).open_api_writes, spans)


def _outcome(exc: BaseException | None, http_status: int | None, log_id: str) -> WriteResult:
    if exc is None:
        return WriteResult(OK, http_status, 0, log_id)
    if isinstance(exc, FeishuAPIError):
        status = exc.http_status or http_status
        return WriteResult(ERROR, status, exc.code, exc.log_id or log_id, exc)
    # FeishuTransportError (timeout, connection), or the write was cancelled: no answer was read.
    return WriteResult(NO_ANSWER, http_status, None, log_id, exc)
