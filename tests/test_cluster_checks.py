"""The multi-instance checks (tests/cluster_checks.py) on hand-made update logs: each rule passes a clean
log and names the message, the instances and the times of a broken one."""

from __future__ import annotations

import math
from typing import Any

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.domain import TaskStatus
from tests.cluster_checks import (
    card_marks,
    card_status,
    event_mark,
    last_writers,
    out_of_order_events,
    overlapping_updates,
    rate_limit_answers,
    regressions_after_final,
    takeover_seconds,
    undelivered_finals,
    writer_changes,
    writes_by,
)
from tests.fakes import card_model

RUNNING, COMPLETED, FAILED = TaskStatus.RUNNING, TaskStatus.COMPLETED, TaskStatus.FAILED


def card(
    status: TaskStatus, marks: int = 0, *, locales: tuple[str, ...] = ("zh_cn", "en_us")
) -> dict[str, Any]:
    content = "".join(event_mark(i) for i in range(marks))
    return build_progress_card(card_model(session_id=1, status=status, content=content, locales=locales))


def update(
    arrived: float,
    answered: float | None,
    instance: str | None = "fp-0",
    *,
    code: int | None = 0,
    endpoint: str = "patch",
    concurrent: int = 0,
) -> dict[str, Any]:
    return {
        "endpoint": endpoint,
        "instance": instance,
        "arrived": arrived,
        "answered": answered,
        "code": code,
        "status": 200,
        "version": None,
        "concurrent": concurrent,
    }


def message(
    updates: list[dict[str, Any]], cards: list[dict[str, Any]] | None = None, message_id: str = "om_1"
) -> dict[str, Any]:
    cards = cards or [card(RUNNING)]
    return {
        "message_id": message_id,
        "updates": updates,
        "card": cards[-1],
        "history": [{"sandbox_time": float(i), "card": shown} for i, shown in enumerate(cards)],
    }


def test_card_status_and_marks_read_a_real_progress_card_in_any_locale() -> None:
    assert card_status(card(FAILED, 2)) is FAILED
    assert card_status(card(COMPLETED, locales=("de_de",))) is COMPLETED
    assert card_status({"schema": "2.0", "body": {"elements": []}}) is None
    assert card_marks(card(RUNNING, 3)) == [0, 1, 2]


def test_sequential_updates_do_not_overlap_but_any_concurrency_is_named() -> None:
    clean = message([update(1.0, 1.2), update(1.2, 1.5, "fp-1"), update(2.0, 2.1)])
    assert overlapping_updates([clean]) == []
    crossed = message([update(1.0, 1.5), update(1.4, 1.6, "fp-1")])
    (problem,) = overlapping_updates([crossed])
    assert "patch from fp-1 at 1.400 overlapped patch from fp-0 at 1.000" in problem
    # An update never answered is in flight for ever; the sandbox's own flag counts as well.
    assert overlapping_updates([message([update(1.0, None), update(9.0, 9.1, "fp-1")])])
    assert overlapping_updates([message([update(1.0, 1.1, concurrent=1)])])


def test_a_card_that_changes_after_its_final_is_a_regression() -> None:
    assert regressions_after_final([message([], [card(RUNNING), card(FAILED), card(FAILED)])]) == []
    assert regressions_after_final([message([], [card(RUNNING), card(COMPLETED), card(RUNNING)])]) == [
        "om_1: version 2 shows RUNNING after COMPLETED"
    ]
    assert regressions_after_final([message([], [card(COMPLETED), card(FAILED)])])


def test_a_final_not_on_the_last_card_is_undelivered() -> None:
    done = message([], [card(RUNNING), card(COMPLETED)])
    assert undelivered_finals([done], {"om_1": COMPLETED}) == []
    assert undelivered_finals([done], {"om_1": FAILED}) == ["om_1: shows COMPLETED, expected FAILED"]
    assert undelivered_finals([done], {"om_2": COMPLETED}) == ["om_2: shows None, expected COMPLETED"]


def test_rate_limit_answers_are_listed() -> None:
    log = message([update(1.0, 1.1), update(2.0, 2.1, code=230020), update(3.0, 3.1, code=99991400)])
    assert len(rate_limit_answers([log])) == 2
    assert rate_limit_answers([message([update(1.0, 1.1, code=230031)])]) == []


def test_events_must_show_once_in_order_and_all_at_the_end() -> None:
    good = message([], [card(RUNNING), card(RUNNING, 2), card(COMPLETED, 3)])
    assert out_of_order_events([good], {"om_1": 3}) == []
    short = message([], [card(RUNNING), card(COMPLETED, 2)])
    assert out_of_order_events([short], {"om_1": 3}) == ["om_1: the last card shows 2 events, expected 3"]
    swapped = card(RUNNING)
    swapped["body"]["elements"].append({"tag": "markdown", "content": "ev1;ev0;"})
    assert out_of_order_events([message([], [swapped, card(COMPLETED, 2)])], {"om_1": 2}) == [
        "om_1: version 0 shows events [1, 0]"
    ]
    assert out_of_order_events([], {"om_9": 1}) == ["om_9: no such message in the sandbox"]


def test_takeover_is_measured_from_the_kill_to_another_instances_first_update() -> None:
    victims = message([update(1.0, 1.1, "fp-0"), update(5.0, 5.1, "fp-0"), update(13.5, 13.6, "fp-1")])
    other = message([update(2.0, 2.1, "fp-2"), update(11.0, 11.1, "fp-2")], message_id="om_2")
    orphan = message([update(3.0, 3.1, "fp-0")], message_id="om_3")
    logs = [victims, other, orphan]
    assert last_writers(logs, before=10.0) == {"om_1": "fp-0", "om_2": "fp-2", "om_3": "fp-0"}
    assert takeover_seconds(logs, "fp-0", since=10.0) == {"om_1": 3.5, "om_3": math.inf}


def test_writes_after_a_moment_and_writer_changes_are_listed() -> None:
    log = message([update(1.0, 1.1, "fp-0"), update(2.0, 2.1, "fp-1"), update(3.0, 3.1, "fp-0")])
    assert writes_by([log], "fp-0", since=2.5) == ["om_1: patch from fp-0 at 3.000"]
    assert writes_by([log], "fp-0", since=2.5, message_ids=["om_2"]) == []
    assert writer_changes([log]) == [("om_1", 2.0, "fp-0", "fp-1"), ("om_1", 3.0, "fp-1", "fp-0")]
