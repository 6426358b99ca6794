"""How ``serve`` starts, as a user runs it (subprocesses): what it refuses in one line, and its help.

A second single-mode serve on a held database names the holder; busy ports name their setting; the
refused process leaves no holder row behind. ``serve --help`` names the settings that matter.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import pytest

from feishu_progress.cli import build_parser
from feishu_progress.config import setting_names
from feishu_progress.db.engine import Database
from tests.rigs import answers_200, eventually
from tests.service_process import free_port
from tests.test_holder import holder_row

REPO = Path(__file__).resolve().parent.parent


def test_serve_help_names_the_settings_that_matter_and_where_the_rest_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    named = set(re.findall(r"\bFP_[A-Z_]+[A-Z]", text))
    assert named <= set(setting_names()), named - set(setting_names())  # no stale or mistyped name
    for wanted in (
        "FP_DATABASE_URL",
        "FP_FEISHU__APP_ID",
        "FP_API__TOKEN",
        "FP_HTTP__PORT",
        "FP_ADMIN__PORT",
    ):
        assert wanted in named
    assert ".env.example" in text and "doctor" in text and "migrate" in text


def serve_env(tmp_path: Path, db_name: str, port: int, admin_port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
    env.update(
        PYTHONPATH=str(REPO),
        FP_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / db_name}",
        FP_HTTP__PORT=str(port),
        FP_ADMIN__PORT=str(admin_port),
        FP_INSTANCE_ID="fp-first",
        FP_LOG_LEVEL="WARNING",
    )
    return env


async def refused_line(env: Mapping[str, str], cwd: Path) -> str:
    """Run a serve that must refuse: its exit code is not 0, it ends on one line and no traceback."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode not in (0, None)
    output = stderr.decode()
    assert "Traceback" not in output, output
    refusals = [line for line in output.splitlines() if line.startswith("feishu-progress:")]
    assert len(refusals) == 1 and output.rstrip().endswith(refusals[0]), output  # besides the log's warnings
    assert "sandbox preview" not in stdout.decode()  # it never listened
    return refusals[0]


@pytest.fixture
async def first_serve(tmp_path: Path) -> AsyncIterator[tuple[int, int]]:
    port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=serve_env(tmp_path, "one.db", port, admin_port), cwd=tmp_path,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http:
            ready = f"http://127.0.0.1:{admin_port}/readyz"
            await eventually(
                lambda: answers_200(http, ready), timeout=60, interval=0.2, what=f"{ready} to answer"
            )
        yield port, admin_port
    finally:
        process.terminate()
        await process.wait()


@pytest.mark.slow
async def test_a_second_serve_refuses_in_one_line_and_busy_ports_name_their_setting(
    first_serve: tuple[int, int], tmp_path: Path
) -> None:
    port, admin_port = first_serve
    same_database = serve_env(tmp_path, "one.db", free_port(), free_port())
    line = await refused_line({**same_database, "FP_INSTANCE_ID": "fp-second"}, tmp_path)
    assert "will not serve" in line and "instance fp-first" in line and "FP_DATABASE_URL" in line, line

    busy_admin = serve_env(tmp_path, "two.db", free_port(), admin_port)
    line = await refused_line(busy_admin, tmp_path)
    assert "FP_ADMIN__PORT" in line and str(admin_port) in line, line

    busy_http = serve_env(tmp_path, "three.db", port, free_port())
    line = await refused_line(busy_http, tmp_path)
    assert "FP_HTTP__PORT" in line and str(port) in line, line
    # The refused one let go of its database on the way out: another serve may have it at once.
    assert await holder_row_of(tmp_path / "three.db") is None


async def holder_row_of(path: Path) -> tuple[str, str, int] | None:
    database = Database.open(f"sqlite+aiosqlite:///{path}")
    try:
        return await holder_row(database)
    finally:
        await database.close()
