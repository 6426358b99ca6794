"""tools/specs.py, the one table of tools: its texts exist, and each part is what the card uses."""

from __future__ import annotations

import pytest

from feishu_progress.domain import ToolCall
from feishu_progress.i18n import CATALOG_LOCALES, Msg, all_messages
from feishu_progress.tools.approval import approval_title
from feishu_progress.tools.call_line import line_for_call
from feishu_progress.tools.specs import IMAGE_TOOLS, TOOLS, input_preview_text, tool_spec
from feishu_progress.tools.view_models import ImageGridView


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_every_spec_names_catalog_texts_in_every_locale(name: str) -> None:
    spec = TOOLS[name]
    keys = [spec.verb.key if isinstance(spec.verb, Msg) else spec.verb]
    keys += [spec.approval] if spec.approval else []
    catalog = all_messages()
    for key in keys:
        assert key in catalog, key
        assert set(CATALOG_LOCALES) <= set(catalog[key]), key


def test_image_tools_are_the_tools_whose_view_is_an_image_grid() -> None:
    assert {"generate_image", "edit_image"} == IMAGE_TOOLS
    result = {"images": [{"image_url": "https://x/a.png"}]}
    for name in IMAGE_TOOLS:
        line = line_for_call(ToolCall("c", name, {"prompt": "cat"}, result, finished=True))
        assert isinstance(line.view, ImageGridView)
        assert line.view.prompt == "cat"


def test_the_spec_is_what_the_card_uses() -> None:
    # The preview, the approval title and the view all come from the same entry.
    assert input_preview_text("read_file", {"path": "a.py"}) == TOOLS["read_file"].preview({"path": "a.py"})
    assert approval_title("write_file") == Msg("tool.approval.write_file")
    assert approval_title("read_file") == Msg("tool.approval.generic")
    assert tool_spec("shell", {"action": "write_stdin"}).verb == "tool.shell.write_stdin"
    assert tool_spec("shell", {"command": "ls"}) is TOOLS["shell"]
    assert tool_spec("feishu_send_file", {}).preview({"file_name": "r.pdf"}) == "r.pdf"
