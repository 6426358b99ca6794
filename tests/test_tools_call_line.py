"""line_for_call: view vs raw result, and never raising on any input (hypothesis)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feishu_progress.domain import ToolCall
from feishu_progress.i18n import CATALOG_LOCALES, Msg, all_messages, translate
from feishu_progress.tools.call_line import line_for_call, line_for_call_strictly
from feishu_progress.tools.line_model import LineState, ToolLine
from feishu_progress.tools.readers import RAW_RESULT_LIMIT
from feishu_progress.tools.specs import TOOLS
from feishu_progress.tools.view_models import (
    AskAnswer,
    AskAnswersView,
    ImageGridView,
    ImageItem,
    StatusKind,
    SubagentRowsView,
)


def _finished(name: str, args: Any, result: Any) -> ToolLine:
    return line_for_call(ToolCall("id-1", name, args, result, finished=True))


def test_image_result_gets_a_view_and_no_raw() -> None:
    line = _finished("generate_image", {"prompt": "猫"}, {"images": [{"image_url": "u"}], "model": "m"})
    assert line.view == ImageGridView(
        prompt="猫", model="m", size="", items=(ImageItem(url="u", path=None, size_bytes=None, mime=None),)
    )
    assert line.raw_result is None
    assert (line.call_id, line.name) == ("id-1", "generate_image")


def test_views_for_answers_and_subagents() -> None:
    answers = {"answers": [{"question": "Q", "selectedLabels": ["A"], "customInput": None}]}
    line = _finished("ask_user_questions", {}, answers)
    assert line.view == AskAnswersView(answers=(AskAnswer(question="Q", labels=("A",), custom_input=""),))
    rows = {"background_subagents": [{"taskId": 1, "status": "RUNNING", "totalRounds": 2}]}
    view = _finished("check_subagent", {}, rows).view
    assert isinstance(view, SubagentRowsView)
    assert [(row.task_id, row.status, row.status_kind, row.rounds) for row in view.rows] == [
        ("1", "RUNNING", StatusKind.RUNNING, 2)
    ]
    assert view.wait is None


@pytest.mark.parametrize(
    "result",
    [
        {"data": [{"b64": "..."}]},
        # Seed 000 D7: a first image without a string image_url is not an image view.
        {"images": [{"image_path": "/data/a.png"}, {"image_url": "u"}]},
        {"images": [{"image_url": 7}]},
    ],
)
def test_view_tool_with_unexpected_shape_shows_raw(result: dict[str, Any]) -> None:
    line = _finished("generate_image", {"prompt": "猫"}, result)
    assert line.view is None
    assert line.raw_result is not None and json.loads(line.raw_result) == result


def test_wait_without_timeout_keeps_results_raw() -> None:
    result = {"completed": 1, "all_completed": True, "results": [{"free": "form"}]}
    line = _finished("wait_subagents", {}, result)
    assert line.view is None
    assert line.raw_result is not None
    assert json.loads(line.raw_result) == result
    assert translate(line.summary) == "等待后台子代理 (完成 1 个 · 全部完成)"


def test_failed_view_tool_has_no_view() -> None:
    line = _finished("generate_image", {"prompt": "猫"}, {"error": "x", "images": [{"image_url": "u"}]})
    assert line.state is LineState.FAILED
    assert line.view is None
    assert line.raw_result is None


def test_unknown_tool_result_is_shown_raw() -> None:
    line = _finished("brand_new_tool", {"x": 1}, "some text result")
    assert line.raw_result == "some text result"
    assert translate(line.summary) == "调用 brand_new_tool"


def test_known_tool_result_that_the_line_covers_is_not_repeated() -> None:
    assert _finished("read_file", {"path": "a"}, {"content": "big file"}).raw_result is None
    assert _finished("shell", {"command": "ls"}, {"exit_code": 0, "stdout": "..."}).raw_result is None


def test_known_tool_with_unexpected_text_result_keeps_it() -> None:
    line = _finished("edit_file", {"path": "a"}, "Edited 2 places")
    assert line.raw_result == "Edited 2 places"


def test_raw_result_is_bounded() -> None:
    line = _finished("brand_new_tool", {}, "x" * 50_000)
    assert line.raw_result is not None
    # The one ellipsis rule: the limit counts the characters kept, the ellipsis comes after them.
    assert line.raw_result == "x" * RAW_RESULT_LIMIT + "…"


def test_running_call_ignores_any_result() -> None:
    line = line_for_call(ToolCall("c", "shell", {"command": "ls"}, {"error": "x"}, finished=False))
    assert line.state is LineState.RUNNING
    assert translate(line.summary) == "执行 ls"


class _Weird:
    """An object no JSON encoder knows."""

    def __repr__(self) -> str:
        return "<weird>"


def test_non_json_values_never_break_the_line() -> None:
    line = _finished("brand_new_tool", {"path": _Weird()}, {"a": _Weird(), "b": {1, 2}})
    assert line.raw_result is not None
    assert "<weird>" in line.raw_result


def test_the_safety_net_returns_a_generic_line() -> None:
    broken = ToolCall("c", "shell", {"command": "x"}, None, finished=True)
    object.__setattr__(broken, "args", _ExplodingMapping())
    line = line_for_call(broken)
    assert translate(line.summary) == "调用 shell"
    with pytest.raises(RuntimeError):
        line_for_call_strictly(broken)


class _ExplodingMapping(dict[str, Any]):
    def get(self, key: str, default: Any = None) -> Any:
        raise RuntimeError("boom")


# ---- never raise ------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
interesting_keys = st.sampled_from(
    [
        "error", "success", "exit_code", "completed", "async", "results", "images", "image_url", "answers",
        "background_subagents", "taskId", "status", "questions", "question", "options", "content", "task_id",
        "name", "command", "input", "session_id", "action", "path", "url", "query", "prompt", "count",
        "tasks",
    ]
)  # fmt: skip
shaped_values = st.recursive(
    json_values,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(interesting_keys, children, max_size=5),
    max_leaves=15,
)
tool_names = st.sampled_from(
    [*TOOLS, "shell", "asktool", "x__asktool", "feishu_send_file", "dingtalk_", "mcp"]
) | st.text(max_size=15)
results = shaped_values | shaped_values.map(lambda v: json.dumps(v, allow_nan=True)) | st.text(max_size=60)


def _keys(text: Any) -> Iterator[str]:
    if isinstance(text, Msg):
        yield text.key
        for value in text.params.values():
            yield from _keys(value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=tool_names, args=shaped_values, result=results, finished=st.booleans())
def test_line_for_call_never_raises_and_only_uses_catalog_keys(
    name: str, args: Any, result: Any, finished: bool
) -> None:
    line = line_for_call_strictly(ToolCall("c", name, args, result, finished=finished))
    assert line.state in set(LineState)
    catalog = all_messages()
    for key in _keys(line.summary):
        assert key in catalog or f"{key}.other" in catalog, key
    for locale in CATALOG_LOCALES:
        assert translate(line.summary, locale).strip()
    if line.raw_result is not None:
        assert line.raw_result.strip()
