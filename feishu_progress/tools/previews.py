"""Input previews: what an in-flight call is working on, from its (possibly partial) arguments.

Seed 000 §3.4 fixes seven cases exactly; the rest are per-tool keys plus a generic fallback (which tool
uses which preview is said once, in ``tools/specs.py``). A preview is never a loading placeholder: when
nothing usable is there yet it is "".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from feishu_progress.i18n import Msg, Text
from feishu_progress.i18n.user_text import cut_text
from feishu_progress.tools.readers import as_int, get_str, shorten

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


def scheduled_name_preview(args: Args) -> Text:
    return cut_text(raw_str(args, "name"), NAME_LIMIT, ellipsis="")


def no_preview(args: Args) -> Text:
    """§3.4: nothing in the arguments is worth showing."""
    return ""


def update_scheduled_preview(args: Args) -> Text:
    name = raw_str(args, "name")
    return cut_text(name, NAME_LIMIT, ellipsis="") if name else task_number(args)


def send_file_preview(args: Args) -> Text:
    return raw_str(args, "file_name") or raw_str(args, "file")


def is_write_stdin(args: Args) -> bool:
    """How the shell tool's two modes are told apart: ``action``, else ``input`` without ``command``."""
    action = get_str(args, "action", "mode")
    if action:
        return action == "write_stdin"
    return "command" not in args and ("input" in args or "session_id" in args)


def shell_preview(args: Args) -> Text:
    key = "input" if is_write_stdin(args) else "command"
    return shorten(raw_str(args, key), TEXT_LIMIT)


def path_preview(args: Args) -> Text:
    return get_str(args, "path", "file_path", "filename")


def pattern_preview(args: Args) -> Text:
    return shorten(get_str(args, "pattern", "query", "glob"), TEXT_LIMIT)


def query_preview(args: Args) -> Text:
    return shorten(get_str(args, "query", "q"), TEXT_LIMIT)


def url_preview(args: Args) -> Text:
    return format_url(get_str(args, "url"))


def http_preview(args: Args) -> Text:
    url = format_url(get_str(args, "url"))
    method = cut_text(get_str(args, "method").upper(), METHOD_LIMIT, ellipsis="")
    return f"{method} {url}" if method and url else url


def prompt_preview(args: Args) -> Text:
    return shorten(get_str(args, "prompt"), TEXT_LIMIT)


def task_text_preview(args: Args) -> Text:
    return shorten(get_str(args, "task", "description", "prompt"), TEXT_LIMIT)


def mcp_target(args: Args) -> str:
    """``server.tool`` (or just the server) of an MCP call."""
    server = get_str(args, "server", "server_name", "serverName")
    tool = get_str(args, "tool", "tool_name", "toolName", "name")
    return shorten(".".join(part for part in (server, tool) if part), TEXT_LIMIT)


def mcp_server_preview(args: Args) -> Text:
    return shorten(get_str(args, "server", "server_name", "serverName"), TEXT_LIMIT)


def image_preview(args: Args) -> Text:
    return raw_str(args, "image")


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
