"""The progress card: seed 002 §6.1 rows, the §4.2.3 golden, header/status/buttons, views, budget."""

from __future__ import annotations

import html
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.cards import sections
from feishu_progress.cards.builder import (
    ANSWER_ELEMENT_ID,
    ANSWER_PLACEHOLDER,
    build_card,
    build_degraded_card,
    build_progress_card,
)
from feishu_progress.cards.size import LEVELS
from feishu_progress.cards.text import Langs
from feishu_progress.cards.validate import (
    card_bytes,
    card_problems,
    element_count,
    nesting_depth,
    tagged_objects,
)
from feishu_progress.cards.view_panels import image_grid
from feishu_progress.domain import (
    AskOption,
    AskQuestion,
    CardModel,
    Notice,
    PendingApproval,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from feishu_progress.i18n import plural, translate
from feishu_progress.tools.line_model import LineState, ToolLine
from feishu_progress.tools.view_models import (
    AskAnswer,
    AskAnswersView,
    AskToolHeadline,
    AskToolView,
    ImageGridView,
    ImageItem,
    StatusKind,
    SubagentRow,
    SubagentRowsView,
    ToolView,
    WaitSummary,
)
from tests.fakes import card_model

GOLDEN = Path(__file__).parent / "golden" / "cards"
SEED_SUBAGENT_SECTION = (
    "**子代理 · 2 个运行中**\n- 调研 · 排查卡片进度链路 · 第 2 轮\n- 开发 · 实现子代理展示 · 恢复中"
)
TAG_LIKE = re.compile(r"<\s*/?\s*[A-Za-z]")
OUR_TAGS = re.compile(r"<text_tag color='[a-z]+'>|</text_tag>")


# -- helpers shared with test_cards_properties --------------------------------------------------


def tagged(node: Any) -> Iterator[Any]:
    """Every object with a ``tag`` under ``node`` (the validator's own walk)."""
    return tagged_objects(node)


def rendered_texts(card: dict[str, Any]) -> Iterator[str]:
    """Every text a viewer may see: ``content`` and ``i18n_content`` values anywhere in the card."""

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "content" and isinstance(value, str):
                    yield value
                elif key == "i18n_content" and isinstance(value, dict):
                    yield from (text for text in value.values() if isinstance(text, str))
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    return walk(card)


def foreign_tags(card: dict[str, Any]) -> list[str]:
    """Tag-like ``<x`` sequences in visible text that the builder did not write itself."""
    found = []
    for text in rendered_texts(card):
        stripped = OUR_TAGS.sub("", text)
        found.extend(match.group(0) for match in TAG_LIKE.finditer(stripped))
    return found


def markdowns(card: dict[str, Any]) -> list[str]:
    """Default-locale content of every markdown element of the body, in order."""
    return [node["content"] for node in tagged(card["body"]) if node["tag"] == "markdown"]


def assert_valid(card: dict[str, Any]) -> None:
    assert card_problems(card) == []
    assert foreign_tags(card) == []


def model(**changes: Any) -> CardModel:
    base: dict[str, Any] = {"session_id": 42, "status": TaskStatus.RUNNING, "round": 3}
    base.update(changes)
    return card_model(**base)


def subagent(
    task_id: int, agent_type: str | None, title: str, status: str = "RUNNING", rnd: int = 0
) -> SubagentSummary:
    return SubagentSummary(task_id=task_id, agent_type=agent_type, title=title, status=status, round=rnd)


def fixed_lines(monkeypatch: pytest.MonkeyPatch, **by_name: ToolLine) -> None:
    """Make line_for_call return given lines: these tests are about cards/, not tools/."""

    def fixed(call: ToolCall) -> ToolLine:
        return by_name[call.name]

    monkeypatch.setattr(sections, "line_for_call", fixed)


def view_line(view: ToolView | None = None, raw: str | None = None, name: str = "t") -> ToolLine:
    return ToolLine(
        call_id=name, name=name, summary=f"{name} line", state=LineState.OK, view=view, raw_result=raw
    )


# -- seed 002 §4.2.3 golden ------------------------------------------------------------------


def seed_example() -> CardModel:
    return model(
        round=121,
        elapsed_ms=192_000,
        content="上一轮的“大小写归一化”会带来新的跨环境风险……",
        title="排查飞书卡片",
        subagents=(
            subagent(1, "explorer", "排查卡片进度链路", rnd=2),
            subagent(2, "worker", "实现子代理展示", status="RECOVERING"),
        ),
        tools=(ToolCall(call_id="c1", name="wait_subagents", args={}),),
        session_detail_url="https://example.com/sessions/{session_id}",
    )


def test_seed_example_matches_golden() -> None:
    """The worked example of §4.2.3 through the real tool line (no literal text in the golden path)."""
    card = build_progress_card(seed_example())
    path = GOLDEN / "seed_002_running_subagents.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(card, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    assert card == json.loads(path.read_text(encoding="utf-8"))
    texts = markdowns(card)
    assert texts[0] == "状态:正在处理 · 第 121 轮 · 已用时 3 分 12 秒"
    assert SEED_SUBAGENT_SECTION in texts
    assert texts.index(SEED_SUBAGENT_SECTION) == texts.index(seed_example().content) + 1
    # The tool line is ours (the seed's ``wait_subagents:…`` is its own formatter): verb plus 执行中.
    assert texts[texts.index(SEED_SUBAGENT_SECTION) + 1] == "**本轮工具**\n- 等待后台子代理 (执行中)"
    assert_valid(card)


# -- seed 002 §6.1 card rows -------------------------------------------------------------------


def subagent_text(card: dict[str, Any]) -> str | None:
    return next((text for text in markdowns(card) if text.startswith("**子代理")), None)


def test_running_with_two_subagents_sits_between_content_and_tools() -> None:
    card = build_progress_card(seed_example())
    texts = markdowns(card)
    position = texts.index(SEED_SUBAGENT_SECTION)
    assert texts[position - 1] == seed_example().content
    assert texts[position + 1].startswith("**本轮工具**")


@pytest.mark.parametrize("subagents", [(), (subagent(1, "explorer", "   "),)])
def test_no_subagents_renders_no_section(subagents: tuple[SubagentSummary, ...]) -> None:
    card = build_progress_card(model(subagents=subagents, content="x"))
    assert subagent_text(card) is None
    assert build_progress_card(model(content="x")) == card


@pytest.mark.parametrize(
    "status",
    [TaskStatus.WAITING, TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.LOST],
)
def test_section_only_while_running(status: TaskStatus) -> None:
    card = build_progress_card(model(status=status, subagents=seed_example().subagents))
    assert subagent_text(card) is None


def test_six_subagents_show_five_lines_and_the_rest() -> None:
    many = tuple(subagent(i, "worker", f"任务 {i}") for i in range(6))
    text = subagent_text(build_progress_card(model(subagents=many)))
    assert text is not None
    lines = text.split("\n")
    assert lines[0] == "**子代理 · 6 个运行中**"
    assert lines[1:6] == [f"- 开发 · 任务 {i}" for i in range(5)]
    assert lines[6:] == ["- 另有 1 个运行中"]


def test_title_is_cleaned_of_breaks_specials_and_length() -> None:
    raw = "第一行\n第二行 **加粗** [链接](x) <at id=all></at> | ~`_\\" + "长" * 80
    text = subagent_text(build_progress_card(model(subagents=(subagent(1, "explorer", raw),))))
    assert text is not None
    line = text.split("\n")[1]
    title = line.removeprefix("- 调研 · ")
    assert "\n" not in title
    assert not set("*_~`[]<>|") & set(title)
    assert title.startswith("第一行 第二行 加粗 链接 (x) at id=all /at &#92;")
    assert len(title.replace("&#92;", "\\")) == 43 and title.endswith("长...")  # cleanTitle: 40 + "..."


def test_backslash_in_a_title_is_kept_and_shown_as_typed() -> None:
    """Seed 002 §4.2.3: the sanitiser's set is ``*_~`[]<>|``; a backslash stays (as an entity)."""
    text = subagent_text(build_progress_card(model(subagents=(subagent(1, "worker", "back\\slash"),))))
    assert text is not None and text.split("\n")[1] == "- 开发 · back&#92;slash"


def test_subagent_section_is_left_aligned_normal_v2() -> None:
    """Seed 002 §4.2.2: the section's markdown carries text_align left and text_size normal_v2."""
    card = build_progress_card(seed_example())
    [element] = [e for e in card["body"]["elements"] if e.get("content", "").startswith("**子代理")]
    assert element["text_align"] == "left" and element["text_size"] == "normal_v2"


def test_manager_cut_title_is_not_cut_again() -> None:
    title = "长" * 40 + "..."
    text = subagent_text(build_progress_card(model(subagents=(subagent(1, "worker", title),))))
    assert text is not None and text.split("\n")[1] == f"- 开发 · {title}"


@pytest.mark.parametrize(
    ("agent_type", "label"),
    [
        ("explorer", "调研"),
        ("worker", "开发"),
        ("reviewer", "审查"),
        ("default", "通用"),
        ("planner", "planner"),
        ("", "子代理"),
        (None, "子代理"),
        ("code_writer", "code&#95;writer"),  # seed 002 §4.2.1: the raw value, shown as typed
        ("x*y", "x&#42;y"),
        ("a\nb  c", "a b c"),
        ("<at id=all></at>", "&#60;at id=all&#62;&#60;/at&#62;"),
        # §4.2.1: an unknown type is shown raw, not cut like a title (the column holds 64).
        ("t" * 64, "t" * 64),
    ],
)
def test_type_labels(agent_type: str | None, label: str) -> None:
    text = subagent_text(build_progress_card(model(subagents=(subagent(1, agent_type, "t"),))))
    assert text is not None and text.split("\n")[1] == f"- {label} · t"


def test_recovering_and_round_meta() -> None:
    text = subagent_text(
        build_progress_card(model(subagents=(subagent(1, "worker", "t", status="RECOVERING", rnd=4),)))
    )
    assert text is not None and text.split("\n")[1] == "- 开发 · t · 第 4 轮 · 恢复中"


def test_ten_thousand_subagents_stay_small() -> None:
    many = tuple(subagent(i, "explorer", f"t{i}") for i in range(10_000))
    card = build_progress_card(model(subagents=many))
    text = subagent_text(card)
    assert text is not None and text.endswith("- 另有 9995 个运行中")
    assert_valid(card)


# -- header, status line, notice, buttons ------------------------------------------------------

STATES = [
    (TaskStatus.RUNNING, "blue", "正在处理"),
    (TaskStatus.WAITING, "orange", "等待回复"),
    (TaskStatus.COMPLETED, "green", "已完成"),
    (TaskStatus.FAILED, "red", "失败"),
    (TaskStatus.CANCELLED, "grey", "已取消"),
    (TaskStatus.LOST, "grey", "失去联系"),
]


@pytest.mark.parametrize(("status", "template", "word"), STATES)
def test_header_colour_and_state_tag(status: TaskStatus, template: str, word: str) -> None:
    card = build_progress_card(model(status=status, round=7, title="我的任务"))
    header = card["header"]
    assert header["template"] == template
    assert header["title"]["content"] == "我的任务"
    assert header["text_tag_list"][0]["text"]["content"] == word
    assert card["config"]["summary"]["content"] == f"{word} · 第 7 轮"
    assert markdowns(card)[0].startswith(f"状态:{word} · 第 7 轮")
    assert card["config"]["update_multi"] is True
    assert_valid(card)


@pytest.mark.parametrize(
    ("elapsed_ms", "text"),
    [
        (0, "状态:正在处理 · 第 3 轮"),
        (12_999, "状态:正在处理 · 第 3 轮 · 已用时 12 秒"),
        (192_000, "状态:正在处理 · 第 3 轮 · 已用时 3 分 12 秒"),
        (3_725_000, "状态:正在处理 · 第 3 轮 · 已用时 1 小时 2 分"),
    ],
)
def test_status_line_elapsed(elapsed_ms: int, text: str) -> None:
    assert markdowns(build_progress_card(model(elapsed_ms=elapsed_ms)))[0] == text


def test_english_is_in_i18n_content() -> None:
    card = build_progress_card(model(round=121, elapsed_ms=192_000))
    status = card["body"]["elements"][0]
    assert status["i18n_content"] == {
        "zh_cn": "状态:正在处理 · 第 121 轮 · 已用时 3 分 12 秒",
        "en_us": "Status: Working · round 121 · 3m 12s elapsed",
    }
    assert card["config"]["locales"] == ["zh_cn", "en_us"]


def test_turkish_only_card_has_no_i18n() -> None:
    card = build_progress_card(model(locales=("tr",), status=TaskStatus.FAILED, error="boom"))
    assert "locales" not in card["config"]
    assert "i18n_content" not in json.dumps(card)
    assert markdowns(card)[0] == "Durum: Başarısız · 3. tur"
    assert_valid(card)


@pytest.mark.parametrize(
    ("notice", "text"),
    [
        (Notice.CANCELLING, "正在取消…"),
        (Notice.RETRYING, "正在重试…"),
        (Notice.ANSWERS_SUBMITTED, "已提交回答"),
    ],
)
def test_notice_follows_status_line(notice: Notice, text: str) -> None:
    assert markdowns(build_progress_card(model(notice=notice)))[1] == text


def test_first_card_says_accepted() -> None:
    card = build_progress_card(model(round=0))
    assert markdowns(card)[1] == "任务已接收,正在准备执行。"


def answer_elements(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [node for node in tagged(card["body"]) if node.get("element_id") == ANSWER_ELEMENT_ID]


def test_a_running_card_without_text_holds_its_answer_element_with_a_placeholder() -> None:
    # A CardKit card can stream its first text only into an element it already has.
    for running in (model(round=0), model(round=3, content="")):
        built = build_card(running)
        (element,) = answer_elements(built.card)
        assert element == {"tag": "markdown", "element_id": ANSWER_ELEMENT_ID, "content": ANSWER_PLACEHOLDER}
        assert built.answer == ANSWER_PLACEHOLDER
        assert "i18n_content" not in element  # a streamed element has one content, in no language
    first = build_progress_card(model(round=0))
    assert markdowns(first)[1:3] == ["任务已接收,正在准备执行。", ANSWER_PLACEHOLDER]
    streaming = build_card(model(round=0, content="第一段"))
    assert streaming.answer == "第一段" and "任务已接收" not in json.dumps(streaming.card, ensure_ascii=False)


@pytest.mark.parametrize("status", [TaskStatus.WAITING, TaskStatus.COMPLETED, TaskStatus.FAILED])
def test_a_card_that_does_not_stream_has_no_placeholder(status: TaskStatus) -> None:
    built = build_card(model(status=status))
    assert answer_elements(built.card) == [] and built.answer is None


def buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [node for node in tagged(card["body"]["elements"][-1]) if node["tag"] == "button"]


def button_texts(card: dict[str, Any]) -> list[str]:
    return [button["text"]["content"] for button in buttons(card)]


@pytest.mark.parametrize(
    ("status", "texts"),
    [
        (TaskStatus.RUNNING, ["点踩", "取消任务"]),
        (TaskStatus.WAITING, ["点踩", "取消任务"]),
        (TaskStatus.FAILED, ["点踩", "重试"]),
        (TaskStatus.COMPLETED, ["点踩"]),
        (TaskStatus.LOST, ["点踩"]),
    ],
)
def test_button_row_by_state(status: TaskStatus, texts: list[str]) -> None:
    assert button_texts(build_progress_card(model(status=status))) == texts


def test_buttons_carry_callback_values_and_detail_url() -> None:
    card = build_progress_card(model(disliked=True, session_detail_url="https://h/s/{session_id}?x=1"))
    row = buttons(card)
    assert [b["text"]["content"] for b in row] == ["已点踩", "取消任务", "会话详情"]
    assert row[0]["behaviors"] == [
        {"type": "callback", "value": {"v": 1, "action": "dislike", "session_id": 42}}
    ]
    assert row[1]["behaviors"][0]["value"] == {"v": 1, "action": "cancel", "session_id": 42}
    assert "confirm" in row[1]
    assert row[2]["behaviors"] == [{"type": "open_url", "default_url": "https://h/s/42?x=1"}]


def test_failed_card_shows_error_and_retry() -> None:
    card = build_progress_card(model(status=TaskStatus.FAILED, error="连接 <at id=all></at> 超时"))
    error = next(text for text in markdowns(card) if text.startswith("**失败原因**"))
    assert "超时" in error and "<at" not in error
    assert buttons(card)[-1]["behaviors"][0]["value"]["action"] == "retry"
    assert_valid(card)


# -- waiting: hint, form, approvals ------------------------------------------------------------


def waiting_model() -> CardModel:
    asks = (
        PendingAsk(
            "ask-1",
            (
                AskQuestion("选哪个?", (AskOption("甲"), AskOption("乙"))),
                AskQuestion("多选", (AskOption("a"), AskOption("b"), AskOption("c")), multi_select=True),
                AskQuestion("自由回答"),
            ),
        ),
    )
    approvals = (PendingApproval("ap-1", "mcp:github", "create issue"),)
    return model(status=TaskStatus.WAITING, pending_asks=asks, pending_approvals=approvals)


def test_waiting_hint_and_form_fields() -> None:
    card = build_progress_card(waiting_model())
    assert "等待你的回复:3 个问题" in markdowns(card)[1]
    form = next(node for node in card["body"]["elements"] if node["tag"] == "form")
    fields = {node["name"]: node for node in tagged(form) if "name" in node and node["tag"] != "form"}
    assert list(fields) == ["q0_0", "q0_0_other", "q0_1", "q0_1_other", "q0_2", "submit_0"]
    assert fields["q0_0"]["tag"] == "select_static"
    assert [o["value"] for o in fields["q0_0"]["options"]] == ["0", "1"]
    assert fields["q0_1"]["tag"] == "multi_select_static" and fields["q0_1"]["required"] is False
    assert fields["q0_2"]["tag"] == "input"
    assert fields["submit_0"]["form_action_type"] == "submit"
    assert fields["submit_0"]["behaviors"][0]["value"] == {
        "v": 1,
        "action": "answers",
        "session_id": 42,
        "ask_id": "ask-1",
    }
    assert_valid(card)


def test_approval_buttons() -> None:
    card = build_progress_card(waiting_model())
    values = [b["behaviors"][0]["value"] for b in tagged(card["body"]) if b.get("tag") == "button"]
    assert {"v": 1, "action": "approve", "session_id": 42, "approval_id": "ap-1"} in values
    assert {"v": 1, "action": "deny", "session_id": 42, "approval_id": "ap-1"} in values
    assert any(text.startswith("**MCP github") for text in markdowns(card))
    assert not [value for value in values if value["action"] == "approve_always"]  # not offered


def test_allow_always_is_a_third_button_only_where_the_runtime_offered_it() -> None:
    approvals = (
        PendingApproval("ap-1", "shell", "make deploy", allow_always=True),
        PendingApproval("ap-2", "mcp:github", "create issue"),
    )
    card = build_progress_card(model(status=TaskStatus.WAITING, pending_approvals=approvals))
    rows = [
        [
            (b["behaviors"][0]["value"]["action"], b["text"]["content"])
            for b in tagged(row)
            if b["tag"] == "button"
        ]
        for row in card["body"]["elements"]
        if row["tag"] == "column_set" and "approval_id" in json.dumps(row)
    ]
    assert rows == [
        [("approve", "同意"), ("approve_always", "始终允许(本任务)"), ("deny", "拒绝")],
        [("approve", "同意"), ("deny", "拒绝")],
    ]
    always = next(
        b for b in tagged(card["body"]) if b.get("tag") == "button" and "始终" in b["text"]["content"]
    )
    assert always["behaviors"][0]["value"] == {
        "v": 1, "action": "approve_always", "session_id": 42, "approval_id": "ap-1"
    }  # fmt: skip
    assert always["text"]["i18n_content"]["en_us"] == "Always allow (this task)"
    assert_valid(card)


def test_no_form_once_terminal() -> None:
    waiting = waiting_model()
    cancelled = replace(waiting, panels=replace(waiting.panels, status=TaskStatus.CANCELLED))
    card = build_progress_card(cancelled)
    assert all(node["tag"] != "form" for node in card["body"]["elements"])


def test_huge_form_is_trimmed_with_markers() -> None:
    options = tuple(AskOption(f"选项 {i} " + "x" * 90) for i in range(60))
    questions = tuple(AskQuestion(f"问题 {i} " + "长" * 500, options) for i in range(40))
    card = build_progress_card(model(status=TaskStatus.WAITING, pending_asks=(PendingAsk("a", questions),)))
    assert_valid(card)
    joined = "\n".join(markdowns(card))
    assert "个问题未显示" in joined
    assert "个选项未列出" in joined


# -- 本轮工具 ---------------------------------------------------------------------------------


def test_plain_lines_group_and_panels_break_them(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed_lines(
        monkeypatch,
        a=view_line(name="a"),
        b=view_line(raw="结果 <at id=all>", name="b"),
        c=view_line(name="c"),
    )
    calls = tuple(ToolCall(call_id=n, name=n) for n in "abc")
    elements = build_progress_card(model(tools=calls))["body"]["elements"]
    tags = [e["tag"] for e in elements]
    start = next(i for i, e in enumerate(elements) if e.get("content", "").startswith("**本轮工具**"))
    assert tags[start : start + 3] == ["markdown", "collapsible_panel", "markdown"]
    assert elements[start]["content"] == "**本轮工具**\n- a line"
    panel = elements[start + 1]
    assert panel["expanded"] is False
    assert panel["header"]["title"] == {"tag": "markdown", "content": "b line"}
    assert panel["elements"][0]["content"] == "结果 &#60;at id=all&#62;"
    assert elements[start + 2]["content"] == "- c line"


def test_five_hundred_calls_keep_the_newest() -> None:
    calls = tuple(
        ToolCall(call_id=str(i), name=f"tool_{i}", finished=True, result={"ok": True}) for i in range(500)
    )
    card = build_progress_card(model(tools=calls))
    assert_valid(card)
    joined = "\n".join(markdowns(card))
    assert "另有 470 个更早的工具调用" in joined
    assert "tool&#95;499" in joined and "tool&#95;469" not in joined


def test_megabyte_result_is_cut_visibly(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed_lines(monkeypatch, big=view_line(raw="数据" * 500_000, name="big"))
    card = build_progress_card(model(tools=(ToolCall(call_id="1", name="big"),)))
    assert_valid(card)
    assert "已截断" in json.dumps(card, ensure_ascii=False)


def test_summary_params_are_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    line = ToolLine(
        "1", "x", plural("card.tools.earlier", "count", {"count": "<at id=all></at> **b**"}), LineState.OK
    )
    fixed_lines(monkeypatch, x=line)
    card = build_progress_card(model(tools=(ToolCall(call_id="1", name="x"),)))
    assert "&#60;at id=all&#62;&#60;/at&#62; &#42;&#42;b&#42;&#42;" in json.dumps(card, ensure_ascii=False)
    assert_valid(card)


# -- rich views ------------------------------------------------------------------------------


def image_view(count: int) -> ImageGridView:
    items = tuple(
        ImageItem(url=f"/u/{i}.png", path=f"/p/{i}.png", size_bytes=2048 * (i + 1), mime="image/png")
        for i in range(count)
    )
    return ImageGridView(prompt="一只猫", model="img-1", size="1024x1024", items=items)


def panel_of(card: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in card["body"]["elements"] if e["tag"] == "collapsible_panel")


@pytest.mark.parametrize(
    ("count", "tag", "mode"),
    [
        (1, "img", None),
        (2, "img_combination", "double"),
        (3, "img_combination", "triple"),
        (4, "img_combination", "bisect"),
        (6, "img_combination", "bisect"),
        (7, "img_combination", "trisect"),
        (9, "img_combination", "trisect"),
        (12, "img_combination", "trisect"),
    ],
)
def test_image_grid_modes(monkeypatch: pytest.MonkeyPatch, count: int, tag: str, mode: str | None) -> None:
    fixed_lines(monkeypatch, generate_image=view_line(image_view(count), name="generate_image"))
    keys = {f"/p/{i}.png": f"img_v3_{i}" for i in range(count)}
    card = build_progress_card(model(tools=(ToolCall(call_id="1", name="generate_image"),), image_keys=keys))
    assert_valid(card)
    grid = next(node for node in tagged(panel_of(card)) if node["tag"] in ("img", "img_combination"))
    assert grid["tag"] == tag
    if mode:
        assert grid["combination_mode"] == mode
        assert [i["img_key"] for i in grid["img_list"]] == [f"img_v3_{i}" for i in range(min(count, 9))]
    notes = panel_of(card)["elements"][-1]["content"]
    assert notes.startswith("1. 2 KB · PNG\n2. 4 KB · PNG" if count > 1 else "1. 2 KB · PNG\n")
    assert (
        translate(plural("view.image.more", "hidden", {"total": count, "hidden": count - 9})) in notes
    ) == (count > 9)


def test_images_without_key_say_unreachable_and_never_show_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed_lines(monkeypatch, generate_image=view_line(image_view(2), name="generate_image"))
    card = build_progress_card(
        model(tools=(ToolCall(call_id="1", name="generate_image"),), image_keys={"/u/0.png": "img_0"})
    )
    grid = next(node for node in tagged(panel_of(card)) if node["tag"] in ("img", "img_combination"))
    assert grid == {"tag": "img", "img_key": "img_0"}
    notes = panel_of(card)["elements"][-1]["content"].split("\n")
    # Seed 000 D5's path text becomes the file's name: the directory is nobody's business in the chat.
    assert notes[:2] == ["1. 2 KB · PNG", "2. 4 KB · PNG 图片不可达 · 1.png"]
    shown = json.dumps(card, ensure_ascii=False)
    assert "/p/1.png" not in shown and "/u/1.png" not in shown
    assert_valid(card)


@pytest.mark.parametrize(
    ("path", "url", "name"),
    [
        ("/secret/dir/cat.png", "https://h/x.png", "cat.png"),
        ("C:\\Users\\me\\cat*1.png", None, "cat&#42;1.png"),
        (None, "https://host.example/a/b/dog.png?token=abc#frag", "dog.png"),
        ("/dir/", None, "dir"),
        (None, "data:image/png;base64,iVBORw0KGgo=", ""),  # inline: no file to name
    ],
)
def test_unreachable_image_names_its_file_without_directory(
    path: str | None, url: str | None, name: str
) -> None:
    view = ImageGridView(
        prompt="", model="", size="", items=(ImageItem(url=url, path=path, size_bytes=None, mime=None),)
    )
    elements = image_grid(view, LEVELS[0], Langs(("zh_cn",)), {})
    expected = f"1. 图片不可达 · {name}" if name else "1. 图片不可达"
    assert elements[-1]["content"].split("\n")[0] == expected
    assert "secret" not in elements[-1]["content"] and "token" not in elements[-1]["content"]


def test_ask_answers_view(monkeypatch: pytest.MonkeyPatch) -> None:
    view = AskAnswersView((AskAnswer("选哪个?", ("甲", "乙"), "补充\n第二行"),))
    fixed_lines(monkeypatch, ask_user_questions=view_line(view, name="ask_user_questions"))
    card = build_progress_card(model(tools=(ToolCall(call_id="1", name="ask_user_questions"),)))
    text = panel_of(card)["elements"][0]["content"]
    assert text == (
        "**选哪个?**\n<text_tag color='blue'>甲</text_tag> <text_tag color='blue'>乙</text_tag>"
        "\n> 补充\n> 第二行"
    )
    assert_valid(card)


def test_subagent_rows_view_nests_recent_output(monkeypatch: pytest.MonkeyPatch) -> None:
    row = SubagentRow("7", "explorer", "RUNNING", StatusKind.RUNNING, 3, 5, 100, 20, "最近 <b>输出</b>")
    view = SubagentRowsView((row,), WaitSummary(completed=1, all_completed=False, timed_out=True))
    fixed_lines(monkeypatch, wait_subagents=view_line(view, name="wait_subagents"))
    card = build_progress_card(model(tools=(ToolCall(call_id="1", name="wait_subagents"),)))
    assert_valid(card)
    panel = panel_of(card)
    assert panel["elements"][0]["content"].startswith("#7 · explorer · <text_tag color='blue'>")
    inner = panel["elements"][1]
    assert inner["tag"] == "collapsible_panel" and inner["expanded"] is False
    assert inner["elements"][0]["content"] == "最近 &#60;b&#62;输出&#60;/b&#62;"
    assert nesting_depth(card) == 3


def asktool_card(view: AskToolView, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> dict[str, Any]:
    fixed_lines(monkeypatch, asktool=view_line(view, name="asktool"))
    return build_progress_card(model(tools=(ToolCall(call_id="1", name="asktool"),), **changes))


def asktool_text(card: dict[str, Any]) -> str:
    (element,) = panel_of(card)["elements"]
    text: str = element["content"]
    return text


def test_asktool_summary_view(monkeypatch: pytest.MonkeyPatch) -> None:
    questions = (
        AskQuestion("优先哪部分?", (AskOption("性能"), AskOption("视觉"))),
        AskQuestion("还想看?", (AskOption("demo"), AskOption("截图")), multi_select=True),
        AskQuestion("跳过的题", (AskOption("x"),)),
    )
    view = AskToolView(questions, (("视觉",), ("demo", "自己写的"), None), False, AskToolHeadline.ANSWERED, 2)
    card = asktool_card(view, monkeypatch)
    assert_valid(card)
    assert not [n for n in tagged(panel_of(card)) if n["tag"] in ("button", "input", "select_static")]
    blocks = asktool_text(card).split("\n\n")
    assert blocks[0] == "**问答**"  # seed 001 §4.5: the block's label
    assert blocks[1].split("\n") == ["**1.** 单选 · 优先哪部分?", "✓ 视觉", "☐ 性能", "☑ **视觉**"]
    assert blocks[2].split("\n") == [
        "**2.** 多选 · 还想看?",
        "✓ demo、自己写的",
        "✎ 输入的其他答案: 自己写的",
        "☑ **demo**",
        "☐ 截图",
    ]
    assert blocks[3].split("\n") == ["**3.** 单选 · 跳过的题", "已跳过", "☐ x"]
    assert len(blocks) == 4  # nothing was cut, so no 会话详情 line


def test_asktool_question_is_markdown_but_neutralised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 001 R3: **粗体** is bold (it read &#42;&#42;粗体&#42;&#42;); tags, images, odd links stay dead."""
    text = "**粗体** <at id=all></at> ![i](img_x) [l](javascript:x)\n# 标题\n```py\nopen fence"
    view = AskToolView((AskQuestion(text, (AskOption("*a*"),)),), (None,), True, AskToolHeadline.PENDING, 0)
    card = asktool_card(view, monkeypatch)
    assert_valid(card)
    lines = asktool_text(card).split("\n\n", 1)[1].split("\n")
    dead = "&#60;at id=all>&#60;/at> !&#91;i&#93;(img_x) [l&#93;(javascript:x)"
    assert lines[0] == f"**1.** 单选 · **粗体** {dead}"
    assert lines[1:5] == ["#### 标题", "```py", "open fence", "```"]  # the open fence is closed
    assert lines[5:] == ["等待回答", "☐ &#42;a&#42;"]  # options and answers stay literal


def test_asktool_shows_every_question_and_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """A-2 / A-8: no cap on questions or options while the card fits (it showed 20 questions)."""
    options = tuple(AskOption(f"o{i}") for i in range(30))
    questions = tuple(AskQuestion(f"q{i}", options) for i in range(25))
    view = AskToolView(questions, (None,) * 25, True, AskToolHeadline.PENDING, 0)
    card = asktool_card(view, monkeypatch)
    assert_valid(card)
    text = asktool_text(card)
    assert [line for line in text.split("\n") if line.startswith("**")][1:] == [
        f"**{i + 1}.** 单选 · q{i}" for i in range(25)
    ]
    assert text.count("☐ o") == 25 * 30
    assert "会话详情" not in text


def test_asktool_cuts_only_the_longest_texts_when_the_card_must(monkeypatch: pytest.MonkeyPatch) -> None:
    """§4.10 order: the longest free texts are cut first, the rest stay whole, the card says where it is."""
    long_question, long_answer = "问" * 20_000, "答" * 9_000
    questions = (
        AskQuestion(long_question, (AskOption("短选项"), AskOption("另一个"))),
        *(AskQuestion(f"短问题 {i}", (AskOption(f"选项 {i}"),)) for i in range(24)),
    )
    answers = ((long_answer,), *((f"选项 {i}",) for i in range(24)))
    view = AskToolView(questions, answers, False, AskToolHeadline.ANSWERED, 25)
    card = asktool_card(view, monkeypatch)
    assert_valid(card)
    assert card_bytes(card) <= 28 * 1024
    text = asktool_text(card)
    for i in range(24):
        assert f"**{i + 2}.** 单选 · 短问题 {i}\n✓ 选项 {i}\n☑ **选项 {i}**" in text
    assert "☐ 短选项\n☐ 另一个" in text
    head = text.split("\n")[2]
    kept_question = head.removeprefix("**1.** 单选 · ")
    assert kept_question.startswith("问") and kept_question.endswith("…")
    kept_answer = next(line for line in text.split("\n") if line.startswith("✓ 答"))
    assert len(kept_answer) == len(kept_question) + 2  # both cut to the same fair length
    dropped = len(long_question) + 2 * len(long_answer) - 3 * (len(kept_question) - 1)
    assert text.endswith(f"…(已截断 {dropped:,} 字,完整内容见会话详情)")


def test_unparseable_asktool_keeps_output_and_questions() -> None:
    """Seed 001 A-5 / R5: the result text and the questions block (the questions vanished)."""
    args = {"questions": [{"question": "Q1?", "options": ["a", "b"]}]}
    call = ToolCall(call_id="1", name="asktool", args=args, result="对不上的文本 <b>", finished=True)
    card = build_progress_card(model(tools=(call,)))
    assert_valid(card)
    panel = panel_of(card)
    assert panel["header"]["title"]["content"] == "调用 asktool"
    output, questions = (element["content"] for element in panel["elements"])
    assert output == "**输出**\n对不上的文本 &#60;b&#62;"
    assert questions.startswith("**输入**\n")
    assert json.loads(html.unescape(questions.removeprefix("**输入**\n"))) == args


# -- budget and degraded card ----------------------------------------------------------------


def test_huge_content_is_cut_with_marker() -> None:
    content = "# 标题\n" + "内容 **粗** <at id=all></at>\n" * 100_000
    card = build_progress_card(model(content=content))
    assert_valid(card)
    assert card_bytes(card) <= 28 * 1024
    marker = next(text for text in markdowns(card) if text.startswith("…(已截断"))
    assert marker.endswith("字,完整内容见会话详情)")


def test_content_is_markdown_but_tags_are_dead() -> None:
    card = build_progress_card(
        model(content="**粗体**\n- 列表\n<font color='red'>x</font> ![i](img_x) [a](lark://x)")
    )
    content = markdowns(card)[1]
    assert content.startswith("**粗体**\n- 列表\n&#60;font")
    assert "![" not in content and "[a](lark" not in content
    assert_valid(card)


def test_degraded_card_is_minimal_and_valid() -> None:
    card = build_degraded_card(seed_example())
    assert_valid(card)
    texts = markdowns(card)
    assert texts[0] == "状态:正在处理 · 第 121 轮 · 已用时 3 分 12 秒"
    assert "会话详情" in texts[1]
    assert card["header"]["title"]["content"] == "排查飞书卡片"
    assert element_count(card) < 20


def test_typical_card_builds_fast() -> None:
    example = seed_example()
    build_progress_card(example)
    start = time.perf_counter()
    for _ in range(200):
        build_progress_card(example)
    per_build_ms = (time.perf_counter() - start) / 200 * 1000
    assert per_build_ms < 5  # generous for slow CI; measured ≈0.5 ms on the dev box
