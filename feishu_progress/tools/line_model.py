"""What tools/ hands to cards/ for one tool call: its line, its state and the rich view under it.

Free of markdown and of any locale. ``Msg`` templates come from the i18n catalogs and are trusted;
their ``str`` params, like every string in a view, are untrusted and escaped by cards/.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from feishu_progress.i18n import Text
from feishu_progress.tools.view_models import ToolView


class LineState(StrEnum):
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class ToolLine:
    """One line of 本轮工具, plus the rich view under it when the result has a known shape.

    ``raw_result`` holds the result as text when it should be shown collapsed (a view could not be
    built for a result that carries more than the line says): never lost, never raw JSON in a view.
    ``raw_args`` holds the arguments as text when a view that reads them could not be built (seed 001
    A-5: an asktool call that cannot be parsed keeps its questions visible, like its result).
    """

    call_id: str
    name: str
    summary: Text
    state: LineState
    view: ToolView | None = None
    raw_result: str | None = None
    raw_args: str | None = None
