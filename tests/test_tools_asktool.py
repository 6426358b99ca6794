"""asktool answer summary (seed 001 §4.1 rules 1-6, A-3 headline, §4.8 cases T1-T7)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from feishu_progress.domain import AskOption, AskQuestion, ToolCall
from feishu_progress.i18n import translate
from feishu_progress.tools.asktool import (
    asktool_headline,
    is_asktool_name,
    is_custom_answer,
    parse_asktool,
    parse_questions,
)
from feishu_progress.tools.call_line import line_for_call
from feishu_progress.tools.line_model import LineState
from feishu_progress.tools.view_models import AskToolHeadline, AskToolView

ARGS = {
    "questions": [
        {
            "question": "你希望我优先优化哪一部分？",
            "options": [{"label": "转录列表性能", "description": "滚动"}, "工具行视觉"],
        },
        {
            "question": "验收时想看到哪些内容？",
            "options": ["本地 demo 预览", "截图对比", "单测"],
            "multiSelect": True,
        },
    ]
}


def _view(args: Any, result: Any) -> AskToolView:
    view = parse_asktool(args, result)
    assert view is not None
    return view


def test_t1_all_answered_with_a_custom_answer() -> None:
    text = "你希望我优先优化哪一部分？：我自己写的答案\n---\n验收时想看到哪些内容？：本地 demo 预览、截图对比"
    view = _view(ARGS, text)
    assert len(view.questions) == 2
    assert view.answers == (("我自己写的答案",), ("本地 demo 预览", "截图对比"))
    assert (view.headline, view.answered, view.pending) == (AskToolHeadline.ANSWERED, 2, False)
    assert is_custom_answer(view.questions[0], "我自己写的答案")
    assert not is_custom_answer(view.questions[1], "截图对比")
    assert translate(asktool_headline(view)) == "2 个问题 · 已作答 2 / 2"


def test_t2_second_question_skipped() -> None:
    view = _view(ARGS, "你希望我优先优化哪一部分？：工具行视觉\n---\n验收时想看到哪些内容？：")
    assert view.answers == (("工具行视觉",), None)
    assert (view.headline, view.answered) == (AskToolHeadline.ANSWERED, 1)
    assert translate(asktool_headline(view)) == "2 个问题 · 已作答 1 / 2"


def test_t3_whole_ask_declined() -> None:
    view = _view(ARGS, "你希望我优先优化哪一部分？：\n---\n验收时想看到哪些内容？：")
    assert view.answers == (None, None)
    assert (view.headline, view.answered, view.pending) == (AskToolHeadline.UNANSWERED, 0, False)
    assert translate(asktool_headline(view)) == "2 个问题 · 未作答"


def test_t4_full_width_colon_inside_the_question() -> None:
    args = {"questions": [{"question": "选择：哪个环境？", "options": ["测试", "生产"]}]}
    view = _view(args, "选择：哪个环境？：生产")
    assert view.answers == (("生产",),)


@pytest.mark.parametrize(
    "result",
    [
        "你希望我优先优化哪一部分？：工具行视觉",  # truncated: second question missing
        "完全对不上的文本",
        # an ASCII colon is not the format
        "你希望我优先优化哪一部分？:工具行视觉\n---\n验收时想看到哪些内容？:单测",
    ],
)
def test_t5_truncated_or_mismatched_text_falls_back(result: str) -> None:
    assert parse_asktool(ARGS, result) is None
    line = line_for_call(ToolCall("c", "asktool", ARGS, result, finished=True))
    assert line.view is None
    assert line.raw_result == result  # never silently drop text
    assert line.raw_args is not None and json.loads(line.raw_args) == ARGS  # the questions stay
    assert translate(line.summary) == "调用 asktool"


def test_t5_envelope_that_does_not_match_shows_its_text_not_its_json() -> None:
    envelope = {"content": "完全对不上的文本", "details": {"x": 1}}
    line = line_for_call(ToolCall("c", "asktool", ARGS, envelope, finished=True))
    assert (line.view, line.raw_result) == (None, "完全对不上的文本")
    assert line.raw_args is not None and json.loads(line.raw_args) == ARGS


@pytest.mark.parametrize(
    "args",
    [
        {"questions": [{"question": ""}]},
        {"questions": [{"options": ["a"]}]},
        {"questions": []},
    ],
)
def test_half_streamed_args_show_what_has_arrived(args: dict[str, Any]) -> None:
    line = line_for_call(ToolCall("c", "asktool", args, None, finished=False))
    assert line.view is None
    assert line.state is LineState.RUNNING
    assert line.raw_args is not None and json.loads(line.raw_args) == args
    assert line.raw_result is None


def test_nothing_streamed_yet_shows_no_empty_block() -> None:
    line = line_for_call(ToolCall("c", "asktool", None, None, finished=False))
    assert (line.view, line.raw_args, line.raw_result) == (None, None, None)


@pytest.mark.parametrize("result", [None, {"details": {}}, {"content": None}, 42])
def test_rule_3_finished_without_result_text_is_waiting_for_an_answer(result: Any) -> None:
    line = line_for_call(ToolCall("c", "asktool", ARGS, result, finished=True))
    assert translate(line.summary) == "提问 · 2 个问题 · 等待回答"  # not 调用 asktool
    assert line.state is LineState.OK
    assert line.view == parse_asktool(ARGS, None)
    assert line.raw_args is None


def test_a_failed_asktool_says_why_and_keeps_its_questions() -> None:
    line = line_for_call(ToolCall("c", "asktool", ARGS, {"error": "用户关闭了对话框"}, finished=True))
    assert translate(line.summary) == "调用 asktool (失败: 用户关闭了对话框)"
    assert line.state is LineState.FAILED
    assert line.view is None
    assert line.raw_args is not None and json.loads(line.raw_args) == ARGS


@pytest.mark.parametrize(
    "name",
    ["Read", "plugin:other", "plugin:asktool_x", "plugin_asktool", "asktool2", "", "ASKTOOL", "asktool:x"],
)
def test_t6_other_tool_names_do_not_match(name: str) -> None:
    assert not is_asktool_name(name)


# Seed 001 §4.1 rule 1: a provider or plugin prefix is removed, then the name must equal asktool.
@pytest.mark.parametrize(
    "name", ["asktool", "functions.asktool", "mcp__pi__asktool", " asktool ", "plugin:asktool", "a:b.asktool"]
)
def test_provider_prefixed_asktool_matches(name: str) -> None:
    assert is_asktool_name(name)


def test_t7_running_with_complete_questions_is_pending() -> None:
    view = _view(ARGS, None)
    assert view.pending
    assert view.answers == (None, None)
    assert view.headline is AskToolHeadline.PENDING
    assert translate(asktool_headline(view)) == "2 个问题 · 等待回答"
    line = line_for_call(ToolCall("c", "asktool", ARGS, None, finished=False))
    assert line.state is LineState.RUNNING
    assert translate(line.summary) == "提问 · 2 个问题 · 等待回答"
    assert line.view == view


def test_crlf_and_envelope_result() -> None:
    text = "你希望我优先优化哪一部分？：工具行视觉\r\n---\r\n验收时想看到哪些内容？：单测"
    assert _view(ARGS, {"content": text, "details": {}}).answers == (("工具行视觉",), ("单测",))
    parts = {"content": [{"type": "text", "text": text}]}
    assert _view(ARGS, parts).answered == 2


def test_segments_may_come_in_any_order() -> None:
    text = "验收时想看到哪些内容？：单测\n---\n你希望我优先优化哪一部分？：工具行视觉"
    assert _view(ARGS, text).answers == (("工具行视觉",), ("单测",))


def test_options_are_normalised_and_illegal_items_dropped() -> None:
    args = {
        "questions": [
            {
                "question": "Q1",
                "options": ["a", {"label": "b", "description": "d"}, {"label": ""}, 3, None, "  "],
            },
            {"question": "", "options": ["x"]},
            "not a question",
            {"question": "Q2"},
        ]
    }
    questions = parse_questions(args)
    assert [q.question for q in questions] == ["Q1", "Q2"]
    assert questions[0].options == (AskOption("a"), AskOption("b", "d"))
    assert questions[0].multi_select is False


@pytest.mark.parametrize(
    "args",
    [None, {}, {"questions": []}, {"questions": "x"}, {"questions": [{"question": ""}]}, '{"questions": ['],
)
def test_no_valid_question_is_none(args: Any) -> None:
    assert parse_asktool(args, "anything") is None


def test_finished_line_and_english_singular() -> None:
    args = {"questions": [{"question": "Go?", "options": ["yes", "no"]}]}
    line = line_for_call(ToolCall("c", "asktool", args, "Go?：yes", finished=True))
    assert line.state is LineState.OK
    assert line.view == AskToolView(
        questions=(AskQuestion("Go?", (AskOption("yes"), AskOption("no"))),),
        answers=(("yes",),),
        pending=False,
        headline=AskToolHeadline.ANSWERED,
        answered=1,
    )
    assert translate(line.summary) == "提问 · 1 个问题 · 已作答 1 / 1"
    assert translate(line.summary, "en_us") == "Asked · 1 question · answered 1 / 1"
    assert line.raw_result is None
