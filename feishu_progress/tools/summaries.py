"""The success lines of finished calls (seed 000 §3.3, D9): ``(label, args, parsed result) -> Summary``.

Which tool uses which line is said once, in ``tools/specs.py``.

A finished line checks the result's error before any success statistic (A class), and a failure
always says why when the result says why (B class: a bare ``(失败)`` only when there is no reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.i18n import Msg, Text
from feishu_progress.tools.line_model import LineState
from feishu_progress.tools.line_parts import count, with_detail
from feishu_progress.tools.previews import is_write_stdin, task_number
from feishu_progress.tools.readers import as_mapping, get_int, get_list, get_str
from feishu_progress.tools.view_labels import wait_summary_msg
from feishu_progress.tools.view_parsers import parse_ask_answers, parse_subagent_rows, wait_summary

Args = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Summary:
    """A finished line: its text, its state, and whether the result holds more than the line says."""

    text: Msg
    state: LineState
    show_raw: bool = False


def _ok(text: Msg, *, show_raw: bool = False) -> Summary:
    return Summary(text=text, state=LineState.OK, show_raw=show_raw)


def counted(key: str, n: int | None) -> Msg | None:
    return None if n is None or n < 0 else count(key, n)


def list_len(node: Any, *keys: str) -> int | None:
    items = node if isinstance(node, list) else get_list(as_mapping(node), *keys)
    return None if items is None else len(items)


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _unexpected(node: Any) -> bool:
    """A result that is neither absent nor an object: the line cannot have read it."""
    return node is not None and not isinstance(node, Mapping)


# ---- success lines: (label, args, parsed result) -> Summary -------------------------------------------


def label_only(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=_unexpected(node))


def label_and_raw(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=node is not None)


def read_file_line(line: Msg, args: Args, node: Any) -> Summary:
    if isinstance(node, str):
        return _ok(with_detail(line, count("tool.detail.lines", _line_count(node))))
    result = as_mapping(node)
    if get_str(result, "media_type") == "image":
        return _ok(with_detail(line, Msg("tool.detail.image")))
    lines = get_int(result, "total_lines", "line_count", "lines", "num_lines")
    content = result.get("content")
    if lines is None and isinstance(content, str):
        lines = _line_count(content)
    return _ok(with_detail(line, counted("tool.detail.lines", lines)), show_raw=_unexpected(node))


def write_file_line(line: Msg, args: Args, node: Any) -> Summary:
    content = args.get("content")
    lines = _line_count(content) if isinstance(content, str) else None
    return _ok(with_detail(line, counted("tool.detail.lines", lines)), show_raw=_unexpected(node))


def edit_file_line(line: Msg, args: Args, node: Any) -> Summary:
    edits = get_int(as_mapping(node), "replacements", "replaced", "occurrences")
    return _ok(with_detail(line, counted("tool.detail.edits", edits)), show_raw=_unexpected(node))


def glob_line(line: Msg, args: Args, node: Any) -> Summary:
    files = get_int(as_mapping(node), "count", "total")
    files = files if files is not None else list_len(node, "files", "matches", "paths")
    return _ok(with_detail(line, counted("tool.detail.files", files)))


def grep_line(line: Msg, args: Args, node: Any) -> Summary:
    matches = get_int(as_mapping(node), "total_matches", "count", "total")
    matches = matches if matches is not None else list_len(node, "matches", "results")
    return _ok(with_detail(line, counted("tool.detail.matches", matches)))


def _exit_status(line: Msg, result: Mapping[str, Any]) -> Summary | None:
    """``(未完成/超时)`` for ``completed: false``, ``(exit N)`` for a reported code; never ``(exit -1)``."""
    if result.get("completed") is False:
        return Summary(with_detail(line, Msg("tool.detail.incomplete")), LineState.FAILED)
    code = get_int(result, "exit_code", "exitCode")
    if code is None:
        return None
    state = LineState.OK if code == 0 else LineState.FAILED
    return Summary(with_detail(line, Msg("tool.detail.exit", {"code": code})), state)


def shell_line(line: Msg, args: Args, node: Any) -> Summary:
    result = as_mapping(node)
    backgrounded = result.get("async") is True or result.get("background") is True
    if backgrounded and not is_write_stdin(args):
        return _ok(with_detail(line, Msg("tool.detail.background")))
    return _exit_status(line, result) or _ok(line, show_raw=_unexpected(node))


def web_search_line(line: Msg, args: Args, node: Any) -> Summary:
    results = get_int(as_mapping(node), "count", "total", "total_results")
    results = results if results is not None else list_len(node, "results", "items")
    return _ok(with_detail(line, counted("tool.detail.results", results)))


def http_call_line(line: Msg, args: Args, node: Any) -> Summary:
    status = get_int(as_mapping(node), "status", "status_code", "statusCode")
    if status is None:
        return _ok(line, show_raw=_unexpected(node))
    state = LineState.FAILED if status >= 400 else LineState.OK
    return Summary(with_detail(line, Msg("tool.detail.http", {"status": status})), state)


def images_line(line: Msg, args: Args, node: Any) -> Summary:
    images = list_len(as_mapping(node), "images")
    return _ok(with_detail(line, counted("tool.detail.images", images)), show_raw=images is None)


def mcp_describe_line(line: Msg, args: Args, node: Any) -> Summary:
    tools = list_len(as_mapping(node), "tools")
    return _ok(with_detail(line, counted("tool.detail.tools", tools)), show_raw=_unexpected(node))


def _task_ref(result: Mapping[str, Any]) -> Text:
    return task_number(result, "task_id") or task_number(result, "taskId") or task_number(result, "id")


def task_ref_line(line: Msg, args: Args, node: Any) -> Summary:
    ref = _task_ref(as_mapping(node))
    return _ok(with_detail(line, ref if isinstance(ref, Msg) else None), show_raw=_unexpected(node))


def list_tasks_line(line: Msg, args: Args, node: Any) -> Summary:
    tasks = list_len(node, "tasks", "scheduled_tasks", "items")
    return _ok(
        with_detail(line, counted("tool.detail.tasks", tasks)), show_raw=tasks is None and node is not None
    )


def check_subagent_line(line: Msg, args: Args, node: Any) -> Summary:
    # Seed 000 step 5: the line says ``N 个任务`` for every shape the view reads, the single-object
    # answer of ``check_subagent(task_id)`` included (one row: ``1 个任务``); its status is in the row.
    view = parse_subagent_rows("check_subagent", node)
    rows = list_len(as_mapping(node), "background_subagents") if view is None else len(view.rows)
    return _ok(with_detail(line, counted("tool.detail.tasks", rows)))


def wait_subagents_line(line: Msg, args: Args, node: Any) -> Summary:
    summary = wait_summary(as_mapping(node))
    return _ok(with_detail(line, None if summary is None else wait_summary_msg(summary)))


def ask_answers_line(line: Msg, args: Args, node: Any) -> Summary:
    # Seed 000 step 4: ``N 组问答`` counts the pairs the view shows (an answer with a blank question is
    # dropped there), never the raw list's length.
    view = parse_ask_answers(node)
    return _ok(with_detail(line, None if view is None else count("tool.detail.answers", len(view.answers))))


def send_line(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=_unexpected(node))
