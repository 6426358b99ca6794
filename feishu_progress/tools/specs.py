"""The one table of tools: how each tool named by the seeds is previewed, summed up and viewed.

A tool's ``ToolSpec`` says everything the card needs of it (seed 000 §3.3, §3.4, D8, D9, goals 1, 3, 4):
its verb, its input preview, its running detail, its success line and (when different) failure label,
the parser of its rich view, and its approval title. Adding a tool, or a view for one, is one entry
in ``TOOLS``; a new kind of view also needs its renderer in ``cards/view_panels.py`` (keyed by view type)
and its texts in the i18n catalogs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.i18n import DEFAULT_LOCALE, Msg, Text, translate
from feishu_progress.i18n.user_text import cut_text, one_line
from feishu_progress.tools import previews as preview
from feishu_progress.tools import summaries as line
from feishu_progress.tools.line_model import LineState
from feishu_progress.tools.line_parts import failed, failure_of, label, with_detail
from feishu_progress.tools.readers import as_mapping, get_str
from feishu_progress.tools.summaries import Summary
from feishu_progress.tools.view_models import ImageGridView, ToolView
from feishu_progress.tools.view_parsers import parse_ask_answers, parse_image_gen, parse_subagent_rows

Args = Mapping[str, Any]
Preview = Callable[[Args], Text]
SuccessLine = Callable[[Msg, Args, Any], Summary]
FailureLabel = Callable[[Args], Msg]
RunningDetail = Callable[[Args], Msg | None]
# (arguments, parsed result) -> the view, or None for a shape the parser does not recognise.
ViewParser = Callable[[Args, Any], ToolView | None]
# §3.3: a failed create_scheduled_task line carries the first 20 characters of the task name.
CREATE_FAILURE_NAME_LIMIT = 20


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """Everything the card knows of one tool; every field but the verb has a generic default."""

    verb: str | Msg
    preview: Preview = preview.generic_preview
    success: SuccessLine = line.label_only
    colon: bool = False
    failure_label: FailureLabel | None = None
    running: RunningDetail | None = None
    # A tool whose result is meant for a rich view: when no view can be built, the raw result is shown.
    view: ViewParser | None = None
    approval: str | None = None  # the catalog key of its approval title (D8); None → 操作待审批


# ---- the parts that some tools share -------------------------------------------------------------------


def _bare(verb: str) -> FailureLabel:
    return lambda args: Msg(verb)


def _create_failure_label(args: Args) -> Msg:
    name = cut_text(preview.raw_str(args, "name"), CREATE_FAILURE_NAME_LIMIT, ellipsis="")
    return label("tool.create_scheduled_task", name)


def _waiting(args: Args) -> Msg:
    return Msg("tool.detail.running")  # wait_subagents says 执行中 while it waits


def _question_count(args: Args) -> Msg | None:
    return line.counted("tool.detail.questions", line.list_len(args, "questions"))


def image_grid_view(args: Args, node: Any) -> ImageGridView | None:
    return parse_image_gen(node, fallback_prompt=get_str(args, "prompt"))


def _ask_answers_view(args: Args, node: Any) -> ToolView | None:
    return parse_ask_answers(node)


def _check_rows_view(args: Args, node: Any) -> ToolView | None:
    return parse_subagent_rows("check_subagent", node)


def _wait_rows_view(args: Args, node: Any) -> ToolView | None:
    return parse_subagent_rows("wait_subagents", node)


# ---- the table -----------------------------------------------------------------------------------------

TOOLS: dict[str, ToolSpec] = {
    "shell": ToolSpec(
        "tool.shell.exec", preview.shell_preview, line.shell_line, approval="tool.approval.shell"
    ),
    "read_file": ToolSpec("tool.read_file", preview.path_preview, line.read_file_line),
    "write_file": ToolSpec(
        "tool.write_file", preview.path_preview, line.write_file_line, approval="tool.approval.write_file"
    ),
    "edit_file": ToolSpec(
        "tool.edit_file", preview.path_preview, line.edit_file_line, approval="tool.approval.edit_file"
    ),
    "glob_search": ToolSpec("tool.glob_search", preview.pattern_preview, line.glob_line),
    "grep_search": ToolSpec("tool.grep_search", preview.pattern_preview, line.grep_line),
    "web_search": ToolSpec("tool.web_search", preview.query_preview, line.web_search_line),
    "open_web_page": ToolSpec("tool.open_web_page", preview.url_preview),
    "http_call": ToolSpec("tool.http_call", preview.http_preview, line.http_call_line),
    "generate_image": ToolSpec(
        "tool.generate_image", preview.prompt_preview, line.images_line, colon=True, view=image_grid_view
    ),
    "edit_image": ToolSpec(
        "tool.edit_image", preview.prompt_preview, line.images_line, colon=True, view=image_grid_view
    ),
    "send_wechat_image": ToolSpec("tool.send_wechat_image", preview.image_preview, line.send_line),
    "send_wechat_file": ToolSpec("tool.send_wechat_file", preview.send_file_preview, line.send_line),
    "mcp_call": ToolSpec("tool.mcp_call", preview.mcp_target, line.label_and_raw),
    "mcp_describe": ToolSpec("tool.mcp_describe", preview.mcp_server_preview, line.mcp_describe_line),
    "create_scheduled_task": ToolSpec(
        "tool.create_scheduled_task",
        preview.scheduled_name_preview,
        line.task_ref_line,
        failure_label=_create_failure_label,
    ),
    "update_scheduled_task": ToolSpec(
        "tool.update_scheduled_task",
        preview.update_scheduled_preview,
        failure_label=_bare("tool.update_scheduled_task"),
    ),
    "delete_scheduled_task": ToolSpec(
        "tool.delete_scheduled_task", preview.task_number, failure_label=_bare("tool.delete_scheduled_task")
    ),
    "list_scheduled_tasks": ToolSpec("tool.list_scheduled_tasks", preview.no_preview, line.list_tasks_line),
    "spawn_subagent": ToolSpec(
        "tool.spawn_subagent", preview.task_text_preview, line.task_ref_line, colon=True
    ),
    "subagent_followup": ToolSpec("tool.subagent_followup", preview.task_text_preview, colon=True),
    "check_subagent": ToolSpec(
        "tool.check_subagent", preview.task_number, line.check_subagent_line, view=_check_rows_view
    ),
    "wait_subagents": ToolSpec(
        "tool.wait_subagents",
        preview.no_preview,
        line.wait_subagents_line,
        running=_waiting,
        view=_wait_rows_view,
    ),
    "cancel_subagent": ToolSpec("tool.cancel_subagent", preview.task_number),
    "ask_user_questions": ToolSpec(
        "tool.ask_user_questions",
        success=line.ask_answers_line,
        running=_question_count,
        view=_ask_answers_view,
    ),
}
# The shell's write_stdin mode is the same tool with another verb.
_SHELL_STDIN = ToolSpec("tool.shell.write_stdin", preview.shell_preview, line.shell_line, colon=True)
# Feishu and DingTalk tools are named ``<platform>_<action>``; their senders take the WeChat ones' keys.
_PLATFORM_PREFIXES = {"dingtalk_": "tool.dingtalk", "feishu_": "tool.feishu"}
_SENDER_PREVIEWS = {"send_image": preview.image_preview, "send_file": preview.send_file_preview}
# Tools whose results may hold images to upload (runtime/images.py): those with an image grid view.
IMAGE_TOOLS = frozenset(name for name, spec in TOOLS.items() if spec.view is image_grid_view)


def _platform_spec(name: str, prefix: str, key: str) -> ToolSpec:
    action = name[len(prefix) :]
    # Send tools answer with an acknowledgement; the others return data the line does not show.
    success = line.send_line if action.startswith("send") else line.label_and_raw
    action_preview = _SENDER_PREVIEWS.get(action, preview.generic_preview)
    return ToolSpec(Msg(key, {"action": action}), action_preview, success, colon=True)


def tool_spec(name: str, args: Args) -> ToolSpec:
    """The spec of a tool by name (shell split by mode, platform prefixes, generic fallback)."""
    if name == "shell" and preview.is_write_stdin(args):
        return _SHELL_STDIN
    spec = TOOLS.get(name)
    if spec is not None:
        return spec
    for prefix, key in _PLATFORM_PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return _platform_spec(name, prefix, key)
    return ToolSpec(
        Msg("tool.generic", {"name": one_line(name) or "?"}), success=line.label_and_raw, colon=True
    )


# ---- what the card asks of a tool ----------------------------------------------------------------------


def input_preview_text(name: str, args: Any) -> Text:
    """The preview as card text: a ``Msg`` for ``任务 #N``, raw untrusted text otherwise ("" if none)."""
    mapping = as_mapping(args)
    if not mapping:
        return ""
    return tool_spec(name, mapping).preview(mapping)


def input_preview(name: str, args: Any, locale: str = DEFAULT_LOCALE) -> str:
    """The preview rendered for one locale (seed 000 §3.4); "" when the arguments say nothing yet."""
    return translate(input_preview_text(name, args), locale)


def tool_label(name: str, args: Args) -> Msg:
    """The tool's verb and what it works on (its input preview)."""
    spec = tool_spec(name, args)
    return label(spec.verb, input_preview_text(name, args), colon=spec.colon)


def running_summary(name: str, args: Args) -> Msg:
    """The line of an in-flight call: verb plus input preview, and the tool's running detail if any."""
    spec = tool_spec(name, args)
    line_text = tool_label(name, args)
    return line_text if spec.running is None else with_detail(line_text, spec.running(args))


def finished_summary(name: str, args: Args, node: Any) -> Summary:
    """The line of a finished call; ``node`` is the parsed result. Errors come before any statistic."""
    spec = tool_spec(name, args)
    failure = failure_of(node)
    if failure is not None:
        failure_label = spec.failure_label(args) if spec.failure_label else tool_label(name, args)
        return Summary(failed(failure_label, failure), LineState.FAILED, show_raw=failure.truncated)
    return spec.success(tool_label(name, args), args, node)


def wants_view(name: str) -> bool:
    """Whether the tool's result is meant for a rich view (else raw only when its line asks for it)."""
    spec = TOOLS.get(name)
    return spec is not None and spec.view is not None


def view_for(name: str, args: Args, node: Any) -> ToolView | None:
    """The rich view of a finished call's parsed result, or None."""
    spec = TOOLS.get(name)
    return None if spec is None or spec.view is None else spec.view(args, node)
