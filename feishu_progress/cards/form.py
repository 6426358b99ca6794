"""Interactive parts: the answer form of each pending ask, approval requests, and the button row."""

from __future__ import annotations

from typing import Any, Literal

from feishu_progress.cards.callback_contract import (
    Action,
    callback_value,
    field_name,
    form_name,
    other_field_name,
    submit_name,
)
from feishu_progress.cards.escape import plain_text
from feishu_progress.cards.size import Limits
from feishu_progress.cards.text import Langs, cap_params, counted, md_text, msg
from feishu_progress.cards.view_panels import inline, question_markdown
from feishu_progress.domain import AskQuestion, CardModel, PendingApproval, PendingAsk, TaskStatus
from feishu_progress.i18n import Text
from feishu_progress.i18n.user_text import ELLIPSIS, cut_text
from feishu_progress.tools.approval import approval_title

LABEL_CHARS = 100  # Feishu's limit on button / option text
QUESTION_CHARS = 600
MAX_APPROVALS = 5
MAX_ANSWER_CHARS = 1000

ButtonType = Literal["default", "primary", "danger"]


def interactive_sections(model: CardModel, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """hr + one form per pending ask + approval requests; nothing once the task is over."""
    panels = model.panels
    if panels.status.is_terminal or not (panels.pending_asks or panels.pending_approvals):
        return []
    elements: list[dict[str, Any]] = [{"tag": "hr"}]
    for index, ask in enumerate(panels.pending_asks):
        elements.append(ask_form(model.session_id, index, ask, limits, langs))
    elements.extend(approval_elements(model, langs))
    return elements


# -- the answer form ---------------------------------------------------------------------------


def ask_form(
    session_id: int, ask_index: int, ask: PendingAsk, limits: Limits, langs: Langs
) -> dict[str, Any]:
    """A form: per question its text, a select / multi-select / input, an optional typed answer."""
    elements: list[dict[str, Any]] = []
    shown = ask.questions[: limits.questions]
    for question_index, question in enumerate(shown):
        elements.extend(_question_elements(ask_index, question_index, question, limits, langs))
    hidden = len(ask.questions) - len(shown)
    if hidden:
        elements.append(langs.md_msg(counted("card.form.more_questions", hidden)))
    submit = _button(
        langs, msg("card.form.submit"), "primary", callback_value("answers", session_id, ask_id=ask.ask_id)
    )
    submit.update(name=submit_name(ask_index), form_action_type="submit")
    elements.append(submit)
    return {"tag": "form", "name": form_name(ask_index), "elements": elements}


def _question_elements(
    ask_index: int, question_index: int, question: AskQuestion, limits: Limits, langs: Langs
) -> list[dict[str, Any]]:
    number = question_index + 1

    def title(locale: str) -> str:
        # The same question reads the same here and in the asktool summary: markdown (seed 001 R3).
        return f"**{number}.** {question_markdown(question.question, QUESTION_CHARS, locale)}"

    elements = [langs.markdown(title)]
    name = field_name(ask_index, question_index)
    if not question.options:
        elements.append(_input(langs, name, msg("card.form.placeholder.input")))
        return elements
    options = question.options[: limits.options]
    choices = [
        {
            "text": {"tag": "plain_text", "content": _option_text(option.label)},
            "value": str(i),
        }
        for i, option in enumerate(options)
    ]
    if question.multi_select:
        placeholder = langs.plain_msg(msg("card.form.placeholder.multi"))
        field = {"tag": "multi_select_static", "name": name, "required": False, "placeholder": placeholder}
    else:
        field = {
            "tag": "select_static",
            "name": name,
            "placeholder": langs.plain_msg(msg("card.form.placeholder.select")),
        }
    field.update(width="fill", options=choices)
    elements.append(field)
    hidden = len(question.options) - len(options)
    if hidden:
        elements.append(langs.md_msg(counted("card.form.more_options", hidden)))
    elements.append(
        _input(langs, other_field_name(ask_index, question_index), msg("card.form.placeholder.other"))
    )
    return elements


def _option_text(label: str) -> str:
    # Feishu caps option text at LABEL_CHARS: the ellipsis must fit inside.
    return cut_text(plain_text(label).strip(), LABEL_CHARS - len(ELLIPSIS)) or "-"


def _input(langs: Langs, name: str, placeholder: Text) -> dict[str, Any]:
    return {
        "tag": "input",
        "name": name,
        "placeholder": langs.plain_msg(placeholder),
        "max_length": MAX_ANSWER_CHARS,
        "width": "fill",
    }


# -- approvals ---------------------------------------------------------------------------------


def approval_elements(model: CardModel, langs: Langs) -> list[dict[str, Any]]:
    """Each pending approval: its title and summary, then its buttons."""
    elements: list[dict[str, Any]] = []
    shown = model.panels.pending_approvals[:MAX_APPROVALS]
    for approval in shown:
        title = cap_params(approval_title(approval.tool_name), LABEL_CHARS)

        def text(locale: str, title: Text = title, summary: str = approval.summary) -> str:
            head = f"**{md_text(title, locale)}**"
            return head + ("\n" + inline(summary, QUESTION_CHARS, locale) if summary.strip() else "")

        elements.append(langs.markdown(text))
        elements.append(button_row(_approval_buttons(model.session_id, approval, langs)))
    hidden = len(model.panels.pending_approvals) - len(shown)
    if hidden:
        elements.append(langs.md_msg(counted("card.more_items", hidden)))
    return elements


def _approval_buttons(session_id: int, approval: PendingApproval, langs: Langs) -> list[dict[str, Any]]:
    """同意 / 始终允许(本任务) (only when the runtime offered it) / 拒绝."""

    def button(action: Action, key: str, kind: ButtonType) -> dict[str, Any]:
        value = callback_value(action, session_id, approval_id=approval.approval_id)
        return _button(langs, msg(key), kind, value)

    buttons = [button("approve", "card.approval.approve", "primary")]
    if approval.allow_always:
        buttons.append(button("approve_always", "card.approval.approve_always", "default"))
    buttons.append(button("deny", "card.approval.deny", "danger"))
    return buttons


# -- buttons -----------------------------------------------------------------------------------


def action_buttons(model: CardModel, langs: Langs) -> dict[str, Any]:
    """点踩 / 取消任务 / 重试 / 会话详情."""
    panels = model.panels
    buttons = [
        _action(model, langs, "card.button.disliked" if panels.disliked else "card.button.dislike", "dislike")
    ]
    if panels.status in (TaskStatus.RUNNING, TaskStatus.WAITING):
        cancel = _action(model, langs, "card.button.cancel", "cancel", "danger")
        cancel["confirm"] = {
            "title": langs.plain_msg(msg("card.cancel_confirm.title")),
            "text": langs.plain_msg(msg("card.cancel_confirm.text")),
        }
        buttons.append(cancel)
    if panels.status is TaskStatus.FAILED:
        buttons.append(_action(model, langs, "card.button.retry", "retry", "primary"))
    url = session_detail_url(model)
    if url is not None:
        detail = _button(langs, msg("card.button.session_detail"), "default", None)
        detail["behaviors"] = [{"type": "open_url", "default_url": url}]
        buttons.append(detail)
    return button_row(buttons)


def session_detail_url(model: CardModel) -> str | None:
    """FP_CARD__SESSION_DETAIL_URL with ``{session_id}`` filled, or None when not configured."""
    if not model.session_detail_url:
        return None
    return model.session_detail_url.replace("{session_id}", str(model.session_id))


def _action(
    model: CardModel, langs: Langs, key: str, action: Action, kind: ButtonType = "default"
) -> dict[str, Any]:
    return _button(langs, msg(key), kind, callback_value(action, model.session_id))


def _button(langs: Langs, text: Text, kind: ButtonType, value: dict[str, Any] | None) -> dict[str, Any]:
    button: dict[str, Any] = {"tag": "button", "type": kind, "text": langs.plain_msg(text)}
    if value is not None:
        button["behaviors"] = [{"type": "callback", "value": value}]
    return button


def button_row(buttons: list[dict[str, Any]]) -> dict[str, Any]:
    """Buttons side by side, each in an auto-width column."""
    columns = [{"tag": "column", "width": "auto", "elements": [button]} for button in buttons]
    return {"tag": "column_set", "flex_mode": "none", "horizontal_spacing": "8px", "columns": columns}
