"""One-line summaries of every tool the seeds name, running and finished (seed 000 §3.3, D9).

A finished line checks the result's error before any success statistic (A class), and a failure
always says why when the result says why (B class: a bare ``(失败)`` only when there is no reason).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.i18n import Msg, Text
from feishu_progress.i18n.user_text import cut_text, one_line
from feishu_progress.tools.line_model import LineState
from feishu_progress.tools.line_parts import count, failed, failure_of, label, with_detail
from feishu_progress.tools.previews import input_preview_text, is_write_stdin, raw_str, task_number
from feishu_progress.tools.readers import as_mapping, get_int, get_list, get_str
from feishu_progress.tools.view_labels import wait_summary_msg
from feishu_progress.tools.view_parsers import parse_ask_answers, parse_subagent_rows, wait_summary

Args = Mapping[str, Any]
# §3.3: a failed create_scheduled_task line carries the first 20 characters of the task name.
CREATE_FAILURE_NAME_LIMIT = 20


@dataclass(frozen=True, slots=True)
class Summary:
    """A finished line: its text, its state, and whether the result holds more than the line says."""

    text: Msg
    state: LineState
    show_raw: bool = False


def _ok(text: Msg, *, show_raw: bool = False) -> Summary:
    return Summary(text=text, state=LineState.OK, show_raw=show_raw)


def _counted(key: str, n: int | None) -> Msg | None:
    return None if n is None or n < 0 else count(key, n)


def _list_len(node: Any, *keys: str) -> int | None:
    items = node if isinstance(node, list) else get_list(as_mapping(node), *keys)
    return None if items is None else len(items)


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _unexpected(node: Any) -> bool:
    """A result that is neither absent nor an object: the line cannot have read it."""
    return node is not None and not isinstance(node, Mapping)


# ---- success lines: (label, args, parsed result) -> Summary -------------------------------------------


def _label_only(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=_unexpected(node))


def _label_and_raw(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=node is not None)


def _read_file(line: Msg, args: Args, node: Any) -> Summary:
    if isinstance(node, str):
        return _ok(with_detail(line, count("tool.detail.lines", _line_count(node))))
    result = as_mapping(node)
    if get_str(result, "media_type") == "image":
        return _ok(with_detail(line, Msg("tool.detail.image")))
    lines = get_int(result, "total_lines", "line_count", "lines", "num_lines")
    content = result.get("content")
    if lines is None and isinstance(content, str):
        lines = _line_count(content)
    return _ok(with_detail(line, _counted("tool.detail.lines", lines)), show_raw=_unexpected(node))


def _write_file(line: Msg, args: Args, node: Any) -> Summary:
    content = args.get("content")
    lines = _line_count(content) if isinstance(content, str) else None
    return _ok(with_detail(line, _counted("tool.detail.lines", lines)), show_raw=_unexpected(node))


def _edit_file(line: Msg, args: Args, node: Any) -> Summary:
    edits = get_int(as_mapping(node), "replacements", "replaced", "occurrences")
    return _ok(with_detail(line, _counted("tool.detail.edits", edits)), show_raw=_unexpected(node))


def _glob(line: Msg, args: Args, node: Any) -> Summary:
    files = get_int(as_mapping(node), "count", "total")
    files = files if files is not None else _list_len(node, "files", "matches", "paths")
    return _ok(with_detail(line, _counted("tool.detail.files", files)))


def _grep(line: Msg, args: Args, node: Any) -> Summary:
    matches = get_int(as_mapping(node), "total_matches", "count", "total")
    matches = matches if matches is not None else _list_len(node, "matches", "results")
    return _ok(with_detail(line, _counted("tool.detail.matches", matches)))


def _exit_status(line: Msg, result: Mapping[str, Any]) -> Summary | None:
    """``(未完成/超时)`` for ``completed: false``, ``(exit N)`` for a reported code; never ``(exit -1)``."""
    if result.get("completed") is False:
        return Summary(with_detail(line, Msg("tool.detail.incomplete")), LineState.FAILED)
    code = get_int(result, "exit_code", "exitCode")
    if code is None:
        return None
    state = LineState.OK if code == 0 else LineState.FAILED
    return Summary(with_detail(line, Msg("tool.detail.exit", {"code": code})), state)


def _shell(line: Msg, args: Args, node: Any) -> Summary:
    result = as_mapping(node)
    backgrounded = result.get("async") is True or result.get("background") is True
    if backgrounded and not is_write_stdin(args):
        return _ok(with_detail(line, Msg("tool.detail.background")))
    return _exit_status(line, result) or _ok(line, show_raw=_unexpected(node))


def _web_search(line: Msg, args: Args, node: Any) -> Summary:
    results = get_int(as_mapping(node), "count", "total", "total_results")
    results = results if results is not None else _list_len(node, "results", "items")
    return _ok(with_detail(line, _counted("tool.detail.results", results)))


def _http_call(line: Msg, args: Args, node: Any) -> Summary:
    status = get_int(as_mapping(node), "status", "status_code", "statusCode")
    if status is None:
        return _ok(line, show_raw=_unexpected(node))
    state = LineState.FAILED if status >= 400 else LineState.OK
    return Summary(with_detail(line, Msg("tool.detail.http", {"status": status})), state)


def _images(line: Msg, args: Args, node: Any) -> Summary:
    images = _list_len(as_mapping(node), "images")
    return _ok(with_detail(line, _counted("tool.detail.images", images)), show_raw=images is None)


def _mcp_describe(line: Msg, args: Args, node: Any) -> Summary:
    tools = _list_len(as_mapping(node), "tools")
    return _ok(with_detail(line, _counted("tool.detail.tools", tools)), show_raw=_unexpected(node))


def _task_ref(result: Mapping[str, Any]) -> Text:
    return task_number(result, "task_id") or task_number(result, "taskId") or task_number(result, "id")


def _with_task_ref(line: Msg, args: Args, node: Any) -> Summary:
    ref = _task_ref(as_mapping(node))
    return _ok(with_detail(line, ref if isinstance(ref, Msg) else None), show_raw=_unexpected(node))


def _list_tasks(line: Msg, args: Args, node: Any) -> Summary:
    tasks = _list_len(node, "tasks", "scheduled_tasks", "items")
    return _ok(
        with_detail(line, _counted("tool.detail.tasks", tasks)), show_raw=tasks is None and node is not None
    )


def _check_subagent(line: Msg, args: Args, node: Any) -> Summary:
    # Seed 000 step 5: the line says ``N 个任务`` for every shape the view reads, the single-object
    # answer of ``check_subagent(task_id)`` included (one row: ``1 个任务``); its status is in the row.
    view = parse_subagent_rows("check_subagent", node)
    rows = _list_len(as_mapping(node), "background_subagents") if view is None else len(view.rows)
    return _ok(with_detail(line, _counted("tool.detail.tasks", rows)))


def _wait_subagents(line: Msg, args: Args, node: Any) -> Summary:
    summary = wait_summary(as_mapping(node))
    return _ok(with_detail(line, None if summary is None else wait_summary_msg(summary)))


def _ask_user_questions(line: Msg, args: Args, node: Any) -> Summary:
    # Seed 000 step 4: ``N 组问答`` counts the pairs the view shows (an answer with a blank question is
    # dropped there), never the raw list's length.
    view = parse_ask_answers(node)
    return _ok(with_detail(line, None if view is None else count("tool.detail.answers", len(view.answers))))


def _send(line: Msg, args: Args, node: Any) -> Summary:
    return _ok(line, show_raw=_unexpected(node))


# ---- the tool table ------------------------------------------------------------------------------------

SuccessLine = Callable[[Msg, Args, Any], Summary]
FailureLabel = Callable[[Args], Msg]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """How one tool is described: its verb, the success line, and (when different) the failure label."""

    verb: str | Msg
    success: SuccessLine = _label_only
    colon: bool = False
    failure_label: FailureLabel | None = None


def _bare(verb: str) -> FailureLabel:
    return lambda args: Msg(verb)


def _create_failure_label(args: Args) -> Msg:
    return label(
        "tool.create_scheduled_task", cut_text(raw_str(args, "name"), CREATE_FAILURE_NAME_LIMIT, ellipsis="")
    )


TOOLS: dict[str, ToolSpec] = {
    "read_file": ToolSpec("tool.read_file", _read_file),
    "write_file": ToolSpec("tool.write_file", _write_file),
    "edit_file": ToolSpec("tool.edit_file", _edit_file),
    "glob_search": ToolSpec("tool.glob_search", _glob),
    "grep_search": ToolSpec("tool.grep_search", _grep),
    "web_search": ToolSpec("tool.web_search", _web_search),
    "open_web_page": ToolSpec("tool.open_web_page"),
    "http_call": ToolSpec("tool.http_call", _http_call),
    "generate_image": ToolSpec("tool.generate_image", _images, colon=True),
    "edit_image": ToolSpec("tool.edit_image", _images, colon=True),
    "send_wechat_image": ToolSpec("tool.send_wechat_image", _send),
    "send_wechat_file": ToolSpec("tool.send_wechat_file", _send),
    "mcp_call": ToolSpec("tool.mcp_call", _label_and_raw),
    "mcp_describe": ToolSpec("tool.mcp_describe", _mcp_describe),
    "create_scheduled_task": ToolSpec(
        "tool.create_scheduled_task", _with_task_ref, failure_label=_create_failure_label
    ),
    "update_scheduled_task": ToolSpec(
        "tool.update_scheduled_task", failure_label=_bare("tool.update_scheduled_task")
    ),
    "delete_scheduled_task": ToolSpec(
        "tool.delete_scheduled_task", failure_label=_bare("tool.delete_scheduled_task")
    ),
    "list_scheduled_tasks": ToolSpec("tool.list_scheduled_tasks", _list_tasks),
    "spawn_subagent": ToolSpec("tool.spawn_subagent", _with_task_ref, colon=True),
    "subagent_followup": ToolSpec("tool.subagent_followup", colon=True),
    "check_subagent": ToolSpec("tool.check_subagent", _check_subagent),
    "wait_subagents": ToolSpec("tool.wait_subagents", _wait_subagents),
    "cancel_subagent": ToolSpec("tool.cancel_subagent"),
    "ask_user_questions": ToolSpec("tool.ask_user_questions", _ask_user_questions),
}
_SHELL_EXEC = ToolSpec("tool.shell.exec", _shell)
_SHELL_STDIN = ToolSpec("tool.shell.write_stdin", _shell, colon=True)
_PLATFORM_PREFIXES = {"dingtalk_": "tool.dingtalk", "feishu_": "tool.feishu"}


def _platform_spec(name: str, prefix: str, key: str) -> ToolSpec:
    action = name[len(prefix) :]
    # Send tools answer with an acknowledgement; the others return data the line does not show.
    success = _send if action.startswith("send") else _label_and_raw
    return ToolSpec(Msg(key, {"action": action}), success, colon=True)


def tool_spec(name: str, args: Args) -> ToolSpec:
    """The spec of a tool by name (shell split by mode, platform prefixes, generic fallback)."""
    if name == "shell":
        return _SHELL_STDIN if is_write_stdin(args) else _SHELL_EXEC
    spec = TOOLS.get(name)
    if spec is not None:
        return spec
    for prefix, key in _PLATFORM_PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return _platform_spec(name, prefix, key)
    return ToolSpec(Msg("tool.generic", {"name": one_line(name) or "?"}), _label_and_raw, colon=True)


def tool_label(name: str, args: Args) -> Msg:
    """The tool's verb and what it works on (its input preview)."""
    spec = tool_spec(name, args)
    return label(spec.verb, input_preview_text(name, args), colon=spec.colon)


def running_summary(name: str, args: Args) -> Msg:
    """The line of an in-flight call: verb plus input preview (wait_subagents says 执行中)."""
    line = tool_label(name, args)
    if name == "wait_subagents":
        return with_detail(line, Msg("tool.detail.running"))
    if name == "ask_user_questions":
        return with_detail(line, _counted("tool.detail.questions", _list_len(args, "questions")))
    return line


def finished_summary(name: str, args: Args, node: Any) -> Summary:
    """The line of a finished call; ``node`` is the parsed result. Errors come before any statistic."""
    spec = tool_spec(name, args)
    failure = failure_of(node)
    if failure is not None:
        failure_label = spec.failure_label(args) if spec.failure_label else tool_label(name, args)
        return Summary(failed(failure_label, failure), LineState.FAILED, show_raw=failure.truncated)
    return spec.success(tool_label(name, args), args, node)
