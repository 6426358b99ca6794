"""Pure rooms: no I/O library loaded (checked in a fresh interpreter), no function over 60 lines."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IO_LIBRARIES = (
    "sqlalchemy",
    "aiohttp",
    "prometheus_client",
    "pydantic_settings",
    "aiomysql",
    "aiosqlite",
    "lark_oapi",
)
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
io = set(sys.argv[2].split(","))
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in io)))
"""


def loaded_io_modules(module: str) -> list[str]:
    """The I/O modules that importing ``module`` loads, in a fresh interpreter running this checkout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, ",".join(IO_LIBRARIES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
        cwd=ROOT,
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    "module",
    [
        "feishu_progress.cards.builder",
        "feishu_progress.tools.call_line",
        "feishu_progress.subagents.titles",
        "feishu_progress.runtime.state",
        "feishu_progress.i18n",
        "feishu_progress.domain",
    ],
)
def test_pure_module_loads_no_io_library(module: str) -> None:
    assert loaded_io_modules(module) == [], module


def test_the_probe_sees_an_io_import() -> None:
    """The check can fail: a module that does I/O is reported."""
    assert "sqlalchemy" in loaded_io_modules("feishu_progress.subagents.query")


PURE_ROOMS = ("cards", "tools", "i18n", "subagents/titles.py", "domain.py")
MAX_FUNCTION_LINES = 60


def test_no_function_in_a_pure_room_is_over_60_lines() -> None:
    package = ROOT / "feishu_progress"
    paths = [path for room in PURE_ROOMS for path in sorted((package / room).glob("**/*.py"))]
    paths += [package / room for room in PURE_ROOMS if room.endswith(".py")]
    assert len(paths) > 20
    long_ones = [
        f"{path.relative_to(package)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long_ones == []
