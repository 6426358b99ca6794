"""SubagentManager: the manager rows of seed 002 §6.1 (both backends, plus a failing database)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.db.models import SubagentExecution
from feishu_progress.db.repo import SubagentRepository
from feishu_progress.domain import SubagentSummary
from feishu_progress.ports import SubagentSource
from feishu_progress.subagents.manager import SubagentManager

T0 = datetime(2026, 10, 19, 8, 0, 0, tzinfo=UTC)


async def spawn(
    repo: SubagentRepository,
    parent: int,
    ref: str,
    *,
    title: str | None = None,
    description: str | None = None,
    agent_type: str | None = "explorer",
    invocation: str = "BACKGROUND",
) -> int:
    return await repo.start(parent, ref, f"ext-{ref}", agent_type, title, description, invocation, T0)


async def test_only_running_subagents_are_returned(db: Database) -> None:
    repo, manager = SubagentRepository(db), SubagentManager(db)
    running = await spawn(repo, 1, "a", title="排查链路")
    recovering = await spawn(repo, 1, "b", title="实现展示", agent_type="worker", invocation="FOLLOWUP")
    finished = await spawn(repo, 1, "c", title="已完成")
    await spawn(repo, 1, "d", title="旧委派", invocation="DELEGATE")
    await repo.set_status(recovering, "RECOVERING")
    await repo.finish(finished, "COMPLETED", 3, T0)

    assert await manager.list_running(1) == [
        SubagentSummary(task_id=running, agent_type="explorer", title="排查链路", status="RUNNING", round=0),
        SubagentSummary(
            task_id=recovering, agent_type="worker", title="实现展示", status="RECOVERING", round=0
        ),
    ]
    assert await manager.list_running(2) == []


async def test_in_memory_round_wins_over_total_rounds(db: Database) -> None:
    repo, manager = SubagentRepository(db), SubagentManager(db)
    tracked = await spawn(repo, 1, "a", title="a")
    untracked = await spawn(repo, 1, "b", title="b")
    # A RECOVERING row after a restart: only the database knows its rounds.
    await repo.finish(untracked, "RECOVERING", 5, T0)
    await repo.finish(tracked, "RUNNING", 5, T0)
    manager.track(tracked, 1)
    manager.set_round(tracked, 2)

    rounds = {summary.task_id: summary.round for summary in await manager.list_running(1)}
    assert rounds == {tracked: 2, untracked: 5}

    manager.set_round(tracked, -1)  # a runtime glitch never shows a negative round
    assert (await manager.list_running(1))[0].round == 0
    manager.untrack(tracked)
    assert (await manager.list_running(1))[0].round == 5  # back to the row's value


async def test_tracking_bookkeeping(db: Database) -> None:
    manager = SubagentManager(db)
    manager.track(3, 1)
    manager.track(2, 1)
    manager.track(9, 7)
    manager.set_round(404, 8)  # unknown ids are ignored
    manager.untrack(404)
    assert manager.tracked(1) == [2, 3]
    manager.untrack(2)
    assert manager.tracked(1) == [3]


async def test_titles_follow_the_fallback_chain(db: Database) -> None:
    repo, manager = SubagentRepository(db), SubagentManager(db)
    await spawn(repo, 1, "a", title="后台子代理(explorer): 排查卡片进度链路")
    await spawn(repo, 1, "b", title="", description="调研\n飞书限流")
    untitled = await spawn(repo, 1, "c", title=None, description=None)
    async with db.session() as session:
        row = await session.get(SubagentExecution, untitled)
    assert row is not None
    titles = [summary.title for summary in await manager.list_running(1)]
    assert titles == ["排查卡片进度链路", "调研 飞书限流", f"子代理 #{row.child_session_id}"]


async def test_list_running_many_matches_list_running(db: Database) -> None:
    repo, manager = SubagentRepository(db), SubagentManager(db)
    first = await spawn(repo, 1, "a", title="一")
    await spawn(repo, 2, "b", title="二")
    await spawn(repo, 1, "c", title="三")
    manager.track(first, 1)
    manager.set_round(first, 7)
    source: SubagentSource = manager  # the port the progress room depends on
    many = await source.list_running_many([1, 2, 3, 1])
    assert many == {parent: await source.list_running(parent) for parent in (1, 2, 3)}
    assert many[1][0].round == 7


async def test_a_failing_query_raises_and_warns_once_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An unmigrated database: the query fails with "no such table". Degrading is the live card's job.
    broken = Database.open(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    manager = SubagentManager(broken)
    manager.track(1, 42)
    try:
        with caplog.at_level(logging.INFO, logger="feishu_progress.subagents.manager"):
            with pytest.raises(OperationalError):
                await manager.list_running(42)
            with pytest.raises(OperationalError):
                await manager.list_running_many([42, 43])
            await upgrade(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
            assert await manager.list_running(42) == []
    finally:
        await broken.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Failed to list running subagents: OperationalError"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "listing running subagents works again"
    ]
