"""Pure rooms import no I/O library: checked in a fresh interpreter, where nothing was loaded before."""

from __future__ import annotations

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
