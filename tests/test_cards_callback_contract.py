"""Callback values, form field names, the answers decoder and the card catalog."""

from __future__ import annotations

from typing import Any

import pytest

from feishu_progress.cards.callback_contract import (
    callback_value,
    decode_form_answers,
    field_name,
    other_field_name,
)
from feishu_progress.domain import AskOption, AskQuestion, PendingAsk
from feishu_progress.i18n import CATALOG_LOCALES
from feishu_progress.i18n.messages.card import MESSAGES

ASK = PendingAsk(
    "ask-1",
    (
        AskQuestion("单选", (AskOption("甲"), AskOption("乙"))),
        AskQuestion("多选", (AskOption("a"), AskOption("b"), AskOption("c")), multi_select=True),
        AskQuestion("自由"),
    ),
)


def test_callback_value_shapes() -> None:
    assert callback_value("cancel", 5) == {"v": 1, "action": "cancel", "session_id": 5}
    assert callback_value("answers", 5, ask_id="a") == {
        "v": 1,
        "action": "answers",
        "session_id": 5,
        "ask_id": "a",
    }
    assert callback_value("deny", 5, approval_id="p")["approval_id"] == "p"
    assert field_name(2, 3) == "q2_3" and other_field_name(2, 3) == "q2_3_other"


def test_decode_full_answers() -> None:
    form = {"q0_0": "1", "q0_0_other": " 补充 ", "q0_1": ["2", "0", "2"], "q0_2": "随便写"}
    assert decode_form_answers(ASK, form) == [(["乙"], "补充"), (["c", "a"], ""), ([], "随便写")]


def test_missing_fields_are_unanswered() -> None:
    assert decode_form_answers(ASK, {}) == [([], ""), ([], ""), ([], "")]
    assert decode_form_answers(ASK, {"q0_0": "", "q0_1": []}) == [([], ""), ([], ""), ([], "")]


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"q0_0": "2"}, "q0_0"),
        ({"q0_0": "x"}, "q0_0"),
        ({"q0_0": "-1"}, "q0_0"),
        ({"q0_0": "²"}, "q0_0"),
        ({"q0_0": 1}, "q0_0"),
        ({"q0_1": "0"}, "q0_1"),
        ({"q0_1": ["0", 1]}, "q0_1"),
        ({"q0_2": ["x"]}, "q0_2"),
        ({"q0_2": "x" * 1001}, "q0_2"),
        ({"q0_9": "0"}, "q0_9"),
        ({"q0_2_other": "x"}, "q0_2_other"),
        ({"hack": "0"}, "hack"),
        ({"q1_0": "0"}, "q1_0"),
    ],
)
def test_malformed_answers_name_the_field(form: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        decode_form_answers(ASK, form, ask_index=0)


def test_card_catalog_is_complete() -> None:
    required = {
        "card.accepted",
        "card.toast.cancelling",
        "card.toast.not_requester",
        "card.toast.task_finished",
        "card.toast.unknown_task",
        "card.toast.expired",
        "card.toast.already_answered",
        "card.toast.answers_submitted",
        "card.toast.retrying",
        "card.toast.disliked",
        "card.toast.undisliked",
        "card.toast.approved",
        "card.toast.approved_always",
        "card.toast.denied",
        "card.toast.invalid_answer",
    }
    assert required <= MESSAGES.keys()
    for key, translations in MESSAGES.items():
        assert key.startswith("card.")
        assert set(translations) == set(CATALOG_LOCALES), key
        assert all(text.strip() for text in translations.values()), key
    assert MESSAGES["card.accepted"]["zh_cn"] == "任务已接收,正在准备执行。"
