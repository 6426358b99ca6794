"""What observing one Open API write costs the event loop: the count, and the count plus a span.

    python bench/write_observer.py --runs 7 --loops 20000

``FeishuClient._observed`` wraps each write request in ``WriteObserver.write`` (feishu/observe.py); this
times that wrapper alone, around no request (a write itself is a network round trip of milliseconds, and
on a shared host its noise hides microseconds), three ways:
   - ``none``: no observer: the client's ``if self._observer is None`` branch (``doctor``'s clients);
   - ``counted``: ``fp_open_api_writes_total`` incremented (the service without a tracer provider);
   - ``traced``: counted plus a client span with its attributes and the card's batch lookup (SDK
     ``TracerProvider``, ``BatchSpanProcessor`` over an exporter that drops spans: exporting runs on the
     SDK's own thread).
Median microseconds per write over the runs (each run ``--loops`` writes), ways interleaved per run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.common import write_section
from feishu_progress.feishu.client import WRITE_ROUTES
from feishu_progress.feishu.observe import WriteObserver, write_observer
from feishu_progress.metrics import Metrics
from feishu_progress.tracing import Tracing

BASE_URL = "https://open.feishu.cn"
METHOD, ROUTE = WRITE_ROUTES["patch"]
MESSAGE_ID = "om_bench_message"


class Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def one_write(observer: WriteObserver | None) -> Callable[[], None]:
    """What the client does around one write, without the request."""

    def write() -> None:
        if observer is None:
            return
        with observer.write("patch", METHOD, ROUTE, MESSAGE_ID) as observed:
            observed.answered(200, "20260101000000BENCHLOGID")

    return write


def timed(write: Callable[[], None], loops: int) -> float:
    started = time.perf_counter()
    for _ in range(loops):
        write()
    return (time.perf_counter() - started) / loops * 1e6


def main(runs: int, loops: int) -> dict[str, float]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    tracing = Tracing(provider)
    ways = {
        "none": one_write(None),
        "counted": one_write(write_observer("default", BASE_URL, Metrics(), None)),
        "traced": one_write(write_observer("default", BASE_URL, Metrics(), tracing)),
    }
    samples: dict[str, list[float]] = {way: [] for way in ways}
    for write in ways.values():
        timed(write, 1000)  # warm
    for _ in range(runs):
        for way, write in ways.items():
            samples[way].append(timed(write, loops))
    provider.shutdown()
    return {way: statistics.median(values) for way, values in samples.items()}


def report(results: dict[str, float], runs: int, loops: int) -> str:
    rows = [f"| `{way}` | {us:.2f} |" for way, us in results.items()]
    return "\n".join(
        [
            "## Observing Open API writes: the count, and a span per write (`bench/write_observer.py`)",
            "",
            f"The wrapper around each write request alone, {loops} writes per run, median of {runs} runs "
            "(ways interleaved). A write's round trip to Feishu is milliseconds.",
            "",
            "| way | µs per write |",
            "|---|---|",
            *rows,
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--loops", type=int, default=20000)
    args = parser.parse_args()
    found = main(args.runs, args.loops)
    text = report(found, args.runs, args.loops)
    print(text)
    write_section("write_observer", text)
