"""SubagentManager: the manager rows of seed 002 §6.1 (both backends, plus a failing database)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from feishu_progress.cards.builder import build_card, build_degraded
from feishu_progress.cards.plaintext import card_as_text
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.db.models import SubagentExecution
from feishu_progress.db.repo import SubagentRepository
from feishu_progress.domain import SubagentSummary, TaskStatus
from feishu_progress.ports import SubagentSource
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.subagents.manager import SubagentManager
from tests.fakes import FakeClock, card_state
from tests.test_scheduler_fakes import FakeSink

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


async def test_a_failing_query_lists_nothing_and_warns_once_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An unmigrated database: the query fails with "no such table". Seed 002 §5.1: list nothing, warn.
    broken = Database.open(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
    manager = SubagentManager(broken, forget_unlisted=True)
    manager.track(1, 42)
    try:
        with caplog.at_level(logging.INFO, logger="feishu_progress.subagents.manager"):
            assert await manager.list_running(42) == []
            assert await manager.list_running_many([42, 43]) == {42: [], 43: []}
            assert manager.tracked(42) == [1]  # a failed query proves nothing ended: the round is kept
            await upgrade(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")
            assert await manager.list_running(42) == []
    finally:
        await broken.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Failed to list running subagents: OperationalError"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "listing running subagents works again"
    ]


async def test_a_failing_query_omits_the_section_instead_of_showing_the_last_list(tmp_path: Path) -> None:
    """Seed 002 §4.1.2/§5.1/§6.1 through the real card: a list that may be wrong is never shown as current."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}"
    await upgrade(url)
    db = Database.open(url)
    clock = FakeClock()
    context = CardContext(session_id=42, message_id="om_42", title="t", started_at=clock.wall())
    card = LiveCard(
        context,
        writer=FakeSink(clock).writer(context.message_id),
        clock=clock,
        build_card=build_card,
        build_degraded_card=build_degraded,
        subagents=SubagentManager(db),
    )
    try:
        await spawn(SubagentRepository(db), 42, "a", title="排查链路")
        card.record(card_state(status=TaskStatus.RUNNING, round=2))
        shown = await card.build_for_delivery()
        assert "**子代理 · 1 个运行中**\n- 调研 · 排查链路" in card_as_text(shown.built.card)
        async with db.engine.begin() as connection:
            await connection.execute(text("DROP TABLE subagent_execution"))
        await clock.advance(1.5)  # past the 1 s cache
        card.record(card_state(status=TaskStatus.RUNNING, round=3))
        after = card_as_text((await card.build_for_delivery()).built.card)
        assert "子代理" not in after and "第 3 轮" in after
    finally:
        await db.close()
