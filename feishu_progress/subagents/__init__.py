"""Running subagents: the read-only query, the title rules and the SubagentManager."""

from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.subagents.query import (
    RunningSubagentRow,
    list_running_by_parent,
    list_running_by_parents,
)
from feishu_progress.subagents.titles import clean_title, running_subagent_title, strip_auto_prefix

__all__ = [
    "RunningSubagentRow",
    "SubagentManager",
    "clean_title",
    "list_running_by_parent",
    "list_running_by_parents",
    "running_subagent_title",
    "strip_auto_prefix",
]
