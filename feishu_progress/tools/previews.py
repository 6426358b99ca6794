"""Input previews: what an in-flight call is working on, from its (possibly partial) arguments.

Seed 000 §3.4 fixes seven cases exactly; the rest are per-tool keys plus a generic fallback. A preview
is never a loading placeholder: when nothing usable is there yet it is "".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from feishu_progress.i18n import DEFAULT_LOCALE, Msg, Text, translate
from feishu_progress.i18n.user_text import cut_text
from feishu_progress.tools.readers import as_int, as_mapping, get_str, shorten

# Free text (commands, queries, prompts, task descriptions) is cut for a one-line card header.
TEXT_LIMIT = 80
URL_LIMIT = 40  # the seed's formatUrl cut
NAME_LIMIT = 30  # §3.4: scheduled task names
METHOD_LIMIT = 10  # an HTTP method is a short word: anything longer is noise
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

# §3.4 generic fallback, in this order.
GENERIC_KEYS = ("task", "task_id", "name", "image", "file", "file_name", "query", "path", "url", "command")

Args = Mapping[str, Any]


def task_number(args: Args, key: str = "task_id") -> Text:
    """``任务 #N`` for a positive integer id (``Number.isInteger(N) && N > 0``), else ""."""
    number = as_int(args.get(key))
    if number is None or number <= 0:
        return ""
    return Msg("tool.preview.task", {"id": number})


def format_url(url: str) -> str:
    """A URL without its scheme, cut to 40 characters."""
    return cut_text(_SCHEME.sub("", url.strip()), URL_LIMIT, ellipsis="")


def raw_str(args: Args, key: str) -> str:
    """The argument as given when it is a non-blank string, else ""."""
    value = args.get(key)
    return value if isinstance(value, str) and value.strip() else ""


def _update_scheduled(args: Args) -> Text:
    name = raw_str(args, "name")
    return cut_text(name, NAME_LIMIT, ellipsis="") if name else task_number(args)


def _send_file(args: Args) -> Text:
    return raw_str(args, "file_name") or raw_str(args, "file")


def is_write_stdin(args: Args) -> bool:
    """How the shell tool's two modes are told apart: ``action``, else ``input`` without ``command``."""
    action = get_str(args, "action", "mode")
    if action:
        return action == "write_stdin"
    return "command" not in args and ("input" in args or "session_id" in args)


def _shell(args: Args) -> Text:
    key = "input" if is_write_stdin(args) else "command"
    return shorten(raw_str(args, key), TEXT_LIMIT)


def _path(args: Args) -> Text:
    return get_str(args, "path", "file_path", "filename")


def _pattern(args: Args) -> Text:
    return shorten(get_str(args, "pattern", "query", "glob"), TEXT_LIMIT)


def _query(args: Args) -> Text:
    return shorten(get_str(args, "query", "q"), TEXT_LIMIT)


def _url(args: Args) -> Text:
    return format_url(get_str(args, "url"))


def _http(args: Args) -> Text:
    url = format_url(get_str(args, "url"))
    method = cut_text(get_str(args, "method").upper(), METHOD_LIMIT, ellipsis="")
    return f"{method} {url}" if method and url else url


def _prompt(args: Args) -> Text:
    return shorten(get_str(args, "prompt"), TEXT_LIMIT)


def _task_text(args: Args) -> Text:
    return shorten(get_str(args, "task", "description", "prompt"), TEXT_LIMIT)


def mcp_target(args: Args) -> str:
    """``server.tool`` (or just the server) of an MCP call."""
    server = get_str(args, "server", "server_name", "serverName")
    tool = get_str(args, "tool", "tool_name", "toolName", "name")
    return shorten(".".join(part for part in (server, tool) if part), TEXT_LIMIT)


def _mcp_describe(args: Args) -> Text:
    return shorten(get_str(args, "server", "server_name", "serverName"), TEXT_LIMIT)


def _image(args: Args) -> Text:
    return raw_str(args, "image")


_PREVIEWS: dict[str, Callable[[Args], Text]] = {
    # seed 000 §3.4, exactly
    "check_subagent": task_number,
    "cancel_subagent": task_number,
    "create_scheduled_task": lambda args: cut_text(raw_str(args, "name"), NAME_LIMIT, ellipsis=""),
    "update_scheduled_task": _update_scheduled,
    "delete_scheduled_task": task_number,
    "send_wechat_image": _image,
    "send_wechat_file": _send_file,
    # the Feishu / DingTalk senders take the same keys
    "feishu_send_image": _image,
    "dingtalk_send_image": _image,
    "feishu_send_file": _send_file,
    "dingtalk_send_file": _send_file,
    # per-tool previews
    "shell": _shell,
    "read_file": _path,
    "write_file": _path,
    "edit_file": _path,
    "glob_search": _pattern,
    "grep_search": _pattern,
    "web_search": _query,
    "open_web_page": _url,
    "http_call": _http,
    "generate_image": _prompt,
    "edit_image": _prompt,
    "spawn_subagent": _task_text,
    "subagent_followup": _task_text,
    "mcp_call": mcp_target,
    "mcp_describe": _mcp_describe,
    # §3.4: nothing worth showing
    "list_scheduled_tasks": lambda args: "",
    "wait_subagents": lambda args: "",
}


def generic_preview(args: Args) -> Text:
    """The first usable value among the generic keys (§3.4 fallback)."""
    for key in GENERIC_KEYS:
        if key == "task_id":
            number = task_number(args)
            if number:
                return number
            continue
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return format_url(value) if key == "url" else shorten(value, TEXT_LIMIT)
    return ""


def input_preview_text(name: str, args: Any) -> Text:
    """The preview as card text: a ``Msg`` for ``任务 #N``, raw untrusted text otherwise ("" if none)."""
    mapping = as_mapping(args)
    if not mapping:
        return ""
    preview = _PREVIEWS.get(name, generic_preview)
    return preview(mapping)


def input_preview(name: str, args: Any, locale: str = DEFAULT_LOCALE) -> str:
    """The preview rendered for one locale (seed 000 §3.4); "" when the arguments say nothing yet."""
    return translate(input_preview_text(name, args), locale)
