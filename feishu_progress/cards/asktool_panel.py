"""The asktool answer summary (seed 001 §4.1-4.5): every question, its answer, every option.

Seed 001 A-2, A-7, A-8 and §4.10 forbid cutting the summary: every question and every option is
shown, and no text is shortened while the card fits. Only Feishu's 30 KB limit can force a cut, and
then it happens in this order:

1. The longest free texts first. Question texts, answers and option labels share one character
   budget per size level (``Limits.asktool_chars``); each text keeps at most the largest common
   length that fits (``size.fair_cap``), so short texts stay whole and only the longest are cut,
   each with an ellipsis. A last line then says how many characters were cut and that the full text
   is in 会话详情.
2. Nothing is ever dropped here: no question, no option, no answer. If the card still cannot fit,
   the builder's smallest levels leave out every view panel, and the tool line keeps saying
   ``提问 · N 个问题 · 已作答 n / N``.

Question texts are markdown (R3), neutralised like the streamed content; everything else is literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feishu_progress.cards.escape import escape_inline, escape_question
from feishu_progress.cards.size import Limits, fair_cap
from feishu_progress.cards.text import Langs, counted, md_text, msg
from feishu_progress.domain import AskQuestion
from feishu_progress.i18n.user_text import cut_index, cut_text
from feishu_progress.tools.asktool import is_custom_answer
from feishu_progress.tools.view_models import AskToolView

ANSWER_SEPARATOR = "、"  # as the result text joins several answers (formatAskToolOutput)


def asktool_panel(view: AskToolView, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """The 问答 block: heading, then per question its number, kind, text, answer and options."""
    cap = fair_cap([len(text) for text in _free_texts(view)], limits.asktool_chars)
    return [langs.markdown(lambda locale: _summary_text(view, cap, locale))]


def _free_texts(view: AskToolView) -> list[str]:
    """Every text the summary shows that came from the agent or the user, as often as it is shown."""
    texts: list[str] = []
    for question, answer in zip(view.questions, _answers(view), strict=True):
        texts.append(question.question)
        texts.extend(answer or ())
        texts.extend(value for value in answer or () if is_custom_answer(question, value))
        texts.extend(option.label for option in question.options)
    return texts


def _answers(view: AskToolView) -> list[tuple[str, ...] | None]:
    return [view.answers[i] if i < len(view.answers) else None for i in range(len(view.questions))]


@dataclass
class _Cutter:
    """Cuts each free text to the cap and counts what it dropped, for the closing 会话详情 line."""

    cap: int | None
    dropped: int = 0

    def __call__(self, text: str) -> str:
        if self.cap is None:
            return text
        self.dropped += len(text) - cut_index(text, self.cap)
        return cut_text(text, self.cap)


def _summary_text(view: AskToolView, cap: int | None, locale: str) -> str:
    cut = _Cutter(cap)
    none_key = _unanswered_key(view)
    parts = [f"**{md_text(msg('view.asktool.heading'), locale)}**"]  # §4.5: the block's label
    for number, (question, answer) in enumerate(zip(view.questions, _answers(view), strict=True), 1):
        parts.append(_question_block(number, question, answer, none_key=none_key, cut=cut, locale=locale))
    if cut.dropped:
        parts.append(md_text(counted("card.truncated", cut.dropped), locale))
    return "\n\n".join(parts)


def _unanswered_key(view: AskToolView) -> str:
    """What an unanswered question says: 等待回答 while pending, 已全部拒绝 if all are, else 已跳过."""
    if view.pending:
        return "view.asktool.answerPending"
    if all(answer is None for answer in view.answers):
        return "view.asktool.answerDeclined"
    return "view.asktool.answerSkipped"


def _question_block(
    number: int,
    question: AskQuestion,
    answer: tuple[str, ...] | None,
    *,
    none_key: str,
    cut: _Cutter,
    locale: str,
) -> str:
    kind = "view.asktool.kindMulti" if question.multi_select else "view.asktool.kindSingle"
    # The kind comes first: a question is markdown and may end inside a code block.
    lines = [f"**{number}.** {md_text(msg(kind), locale)} · {escape_question(cut(question.question))}"]
    if answer is None:
        lines.append(md_text(msg(none_key), locale))
    else:
        lines.append("✓ " + ANSWER_SEPARATOR.join(escape_inline(cut(value)) for value in answer))
        custom = md_text(msg("view.asktool.answerCustom"), locale)
        typed = [value for value in answer if is_custom_answer(question, value)]
        lines.extend(f"✎ {custom}: {escape_inline(cut(value))}" for value in typed)
    chosen = set(answer or ())
    for option in question.options:
        text = escape_inline(cut(option.label))
        lines.append(f"☑ **{text}**" if option.label in chosen else f"☐ {text}")
    return "\n".join(lines)
