"""Shared helpers of the benchmarks: the machine, statistics, RSS, a scaled clock, RESULTS.md sections."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def machine() -> str:
    """nproc, CPU model and Python version, as one line."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} × {model}, Python {platform.python_version()} ({sys.platform})"


def rss_bytes(pid: int | str = "self") -> int:
    """The resident set size (VmRSS) of process ``pid`` (default: this one) now, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when every card got the same, 1/n when one card got everything."""
    xs = list(values)
    square_sum = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * square_sum) if xs and square_sum else math.nan


def median(values: Iterable[float]) -> float:
    """Median ignoring NaN (NaN when nothing is left)."""
    xs = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(xs) if xs else math.nan


class ScaledClock:
    """``ports.Clock`` where ``scale`` seconds pass per real second (shared by every bench process).

    ``monotonic`` is CLOCK_MONOTONIC × scale, which every process on the machine agrees on, so the
    service, the sandbox and the load generator all see the same scaled time. ``wall`` stays real.
    """

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def monotonic(self) -> float:
        return time.monotonic() * self.scale

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.scale)


def command_line() -> str:
    """The exact command that is running (for RESULTS.md)."""
    script = Path(sys.argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(Path.cwd())
    return shlex.join(["python", str(script), *sys.argv[1:]])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the ``name`` section of bench/RESULTS.md with ``body`` plus run details."""
    header = f"<!-- section:{name} -->"
    footer = f"<!-- /section:{name} -->"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = (
        f"{header}\n{body.rstrip()}\n\n"
        f"*Machine:* {machine()}  \n*Command:* `{command_line()}`  \n*Date:* {stamp}\n{footer}"
    )
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\n" + RESULTS_PREAMBLE
    pattern = re.compile(re.escape(header) + r".*?" + re.escape(footer), re.DOTALL)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    RESULTS.write_text(text)
    print(f"\nwrote the '{name}' section of {RESULTS}")


RESULTS_PREAMBLE = (
    "Each section is written by one script in `bench/` (medians of `--runs` runs) and carries the machine,\n"
    "the exact command and the date. Re-running a script replaces only its own section.\n"
)
