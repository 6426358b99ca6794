"""Property tests: any input gives a valid card within Feishu's limits, no foreign tag, no odd link."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feishu_progress.cards.builder import build_degraded_card, build_progress_card
from feishu_progress.cards.callback_contract import decode_form_answers
from feishu_progress.cards.escape import escape_markdown
from feishu_progress.cards.size import TARGET_BYTES
from feishu_progress.cards.validate import card_bytes, card_problems
from feishu_progress.domain import (
    AskOption,
    AskQuestion,
    CardModel,
    Notice,
    PendingApproval,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from tests.fakes import card_model
from tests.test_cards_builder import OUR_TAGS, foreign_tags, rendered_texts, tagged

pytestmark = pytest.mark.slow  # hypothesis over every card model: ~80 s of the inner loop

ATTACKS = [
    "<at id=all></at>",
    "<AT  Id = all ></At>",
    "<at ids=ou_1,ou_2></at>",
    "<at email=a@b.c></at>",
    "< at\nid=all>",
    "&#60;at id=all&#62;",
    "&lt;at id=all&gt;",
    "<font color='red'>x</font>",
    "<a href='x'>l</a>",
    "<text_tag color='red'>t</text_tag>",
    "<person id='ou'></person>",
    "<link>",
    "<raw>",
    "![i](img_bad)",
    "[l](javascript:x)",
    "[a[b]c](javascript:x)",
    "[a\nb](lark://x)",
    "[r]: lark://x",
    "<javascript:x>",
    "**",
    "```",
    "| a |\n|---|",
    "# h",
    "\\",
    "\x00\x1f\u2028",
    "<br>",
    "<hr>",
]
text = st.one_of(
    st.text(max_size=80),
    st.sampled_from(ATTACKS),
    st.lists(st.one_of(st.sampled_from(ATTACKS), st.text(max_size=10)), max_size=6).map("".join),
)
locales = st.sampled_from(
    [("zh_cn", "en_us"), ("zh_cn",), ("tr",), ("en_us", "zh_cn", "ja_jp", "de_de", "ko_kr")]
)
json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), text),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)),
    max_leaves=12,
)
tool_names = st.sampled_from(
    [
        "shell",
        "read_file",
        "web_search",
        "generate_image",
        "edit_image",
        "ask_user_questions",
        "check_subagent",
        "wait_subagents",
        "asktool",
        "mcp_call",
        "unknown_tool",
    ]
)
tool_call = st.builds(
    ToolCall,
    call_id=st.text(max_size=8),
    name=st.one_of(tool_names, text),
    args=st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["prompt", "questions", "command", "path", "task_id"]), json_value, max_size=3
        ),
    ),
    result=json_value,
    finished=st.booleans(),
)
question = st.builds(
    AskQuestion,
    question=text,
    options=st.lists(st.builds(AskOption, label=text, description=text), max_size=4).map(tuple),
    multi_select=st.booleans(),
)
models = st.builds(
    card_model,
    session_id=st.integers(min_value=1, max_value=2**53),
    status=st.sampled_from(TaskStatus),
    round=st.integers(min_value=0, max_value=10**6),
    content=text,
    title=text,
    tools=st.lists(tool_call, max_size=4).map(tuple),
    subagents=st.lists(
        st.builds(
            SubagentSummary,
            task_id=st.integers(0, 10**6),
            agent_type=st.one_of(st.none(), text),
            title=text,
            status=st.sampled_from(["RUNNING", "RECOVERING"]),
            round=st.integers(0, 1000),
        ),
        max_size=7,
    ).map(tuple),
    elapsed_ms=st.integers(min_value=0, max_value=10**10),
    pending_asks=st.lists(
        st.builds(
            PendingAsk, ask_id=st.text(max_size=8), questions=st.lists(question, max_size=3).map(tuple)
        ),
        max_size=2,
    ).map(tuple),
    pending_approvals=st.lists(
        st.builds(PendingApproval, approval_id=st.text(max_size=8), tool_name=text, summary=text), max_size=2
    ).map(tuple),
    disliked=st.booleans(),
    notice=st.one_of(st.none(), st.sampled_from(Notice)),
    error=text,
    locales=locales,
    session_detail_url=st.one_of(st.none(), st.just("https://example.com/s/{session_id}")),
    image_keys=st.dictionaries(text, st.text(min_size=1, max_size=8), max_size=2),
)


def live_links(markdown: str) -> list[str]:
    """Non-web link targets a markdown renderer could still act on, as snippets (empty: none).

    Every CommonMark construct that makes a link needs literal syntax, never an entity: an inline
    link a literal "](" (we allow whitespace between, for lenient renderers), a reference definition
    a literal "]:", an autolink a literal "<", an image a literal "![". So the oracle is exact for
    what it checks: a "](" whose destination is not http(s), or any of the other three, is a live link.
    """
    found = [
        markdown[match.start() : match.end() + 16]
        for match in _INLINE_TARGET.finditer(markdown)
        if not _WEB.match(markdown, match.end())
    ]
    found.extend(token for token in ("]:", "<", "![") if token in markdown)
    return found


_INLINE_TARGET = re.compile(r"\]\s*\(\s*")
_WEB = re.compile(r"https?://", re.IGNORECASE)


def check(card: dict[str, Any]) -> None:
    assert card_problems(card) == []
    assert card_bytes(card) <= TARGET_BYTES
    assert foreign_tags(card) == []
    for text in markdown_texts(card):
        assert live_links(OUR_TAGS.sub("", text)) == [], text


def markdown_texts(card: dict[str, Any]) -> list[str]:
    """Every text that Feishu renders as markdown (plain_text fields show "](" literally)."""
    nodes = [node for node in tagged(card) if node.get("tag") == "markdown"]
    return [text for node in nodes for text in rendered_texts(node)]


# -- issue 15 item 9: links in the streamed markdown ----------------------------------------------

link_text = st.lists(
    st.sampled_from(["a", "[", "]", "\n", "b c", "`", "*", "\\", "(", ")", "!", "]:", "长"]), max_size=8
).map("".join)
destination = st.one_of(
    st.sampled_from(
        [
            "javascript:alert(1)",
            "JavaScript:x",
            "lark://applink/x",
            "data:text/html,x",
            "mailto:a@b.c",
            "//evil.example",
            "http:/x",
            "&#106;avascript:x",
            "<javascript:x>",
            "<https://ok.example>",
            "https://ok.example/p",
            "HTTP://ok.example",
        ]
    ),
    st.text(max_size=12),
)
spacing = st.sampled_from(["", " ", "\n", " \n ", "\t"])
link = st.one_of(
    st.builds(lambda t, a, b, d: f"[{t}]{a}({b}{d})", link_text, spacing, spacing, destination),
    st.builds(lambda t, d: f"![{t}]({d})", link_text, destination),
    st.builds(lambda t, a, d: f"[{t}]:{a}{d}", link_text, spacing, destination),
    st.builds(
        lambda q, t, d: f"{q}[{t}]: {d}", st.sampled_from(["> ", "- ", "1. ", "   "]), link_text, destination
    ),
    st.builds(lambda t, d: f"[{t}][r]\n\n[r]: {d}", link_text, destination),
    st.builds(lambda d: f"<{d}>", destination),
)
markdown_with_links = st.lists(st.one_of(link, st.text(max_size=10)), max_size=6).map("".join)


@settings(max_examples=2000, deadline=None)
@given(markdown_with_links)
def test_escaped_markdown_has_no_live_link_but_http(markdown: str) -> None:
    assert live_links(escape_markdown(markdown)) == []


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_characters="[]<>&!\\\r\n"), max_size=20))
def test_web_links_survive(text: str) -> None:
    link = f"[{text}](https://ok.example/p)"
    assert f"]({'https://ok.example/p'})" in escape_markdown(f"see {link} and more")


def test_the_oracle_sees_a_live_link() -> None:
    assert live_links("[a](javascript:x)") == ["](javascript:x)"]
    assert live_links("[r]: lark://x") == ["]:"]
    assert live_links("[a](https://ok)") == []


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models)
def test_any_model_gives_a_valid_card(model: CardModel) -> None:
    check(build_progress_card(model))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models)
def test_any_model_gives_a_valid_degraded_card(model: CardModel) -> None:
    card = build_degraded_card(model)
    check(card)
    assert len(card["body"]["elements"]) == 3


huge_text = st.sampled_from(["长", "<at id=all></at>", "*", "a\n", "&#60;", "😀", "\x01"]).flatmap(
    lambda unit: st.integers(1_000, 40_000).map(lambda n: unit * n)
)


@settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    content=huge_text,
    title=huge_text,
    error=huge_text,
    calls=st.integers(0, 40),
    status=st.sampled_from(TaskStatus),
    many_locales=st.booleans(),
)
def test_huge_inputs_stay_within_limits(
    content: str, title: str, error: str, calls: int, *, status: TaskStatus, many_locales: bool
) -> None:
    tools = tuple(
        ToolCall(
            call_id=str(i),
            name="shell",
            args={"command": content[:5000]},
            result={"error": error[:3000]},
            finished=True,
        )
        for i in range(calls)
    )
    asks = (
        PendingAsk("a", tuple(AskQuestion(title[:3000], (AskOption(content[:500]),) * 3) for _ in range(12))),
    )
    langs = (
        ("zh_cn", "en_us", "zh_tw", "de_de", "es_es", "fr_fr", "ko_kr", "pt_br")
        if many_locales
        else ("zh_cn",)
    )
    model = card_model(
        session_id=1,
        status=status,
        round=9,
        content=content,
        title=title,
        error=error,
        tools=tools,
        subagents=tuple(SubagentSummary(i, "worker", title[:200], "RUNNING", i) for i in range(50)),
        pending_asks=asks,
        locales=langs,
    )
    check(build_progress_card(model))


def test_pathological_shapes() -> None:
    nested: Any = "leaf <at id=all></at>"
    for _ in range(200):
        nested = {"a": [nested]}
    model = card_model(
        session_id=1,
        status=TaskStatus.RUNNING,
        content="x" * 1_000_000,
        tools=(
            *(
                ToolCall(call_id=str(i), name=f"t{i}", args={"deep": nested}, result="r" * 100, finished=True)
                for i in range(500)
            ),
            ToolCall(call_id="big", name="shell", result={"stdout": "y" * 1_000_000}, finished=True),
            ToolCall(call_id="deep", name="check_subagent", result=nested, finished=True),
        ),
        subagents=tuple(SubagentSummary(i, "explorer", f"t{i}", "RUNNING", 1) for i in range(10_000)),
    )
    check(build_progress_card(model))


@settings(max_examples=1000, deadline=None)
@given(
    form=st.dictionaries(
        st.one_of(st.sampled_from(["q0_0", "q0_0_other", "q0_1", "q0_2", "q0_9"]), st.text(max_size=6)),
        json_value,
        max_size=4,
    )
)
def test_decoder_accepts_or_names_the_field(form: dict[str, Any]) -> None:
    ask = PendingAsk(
        "a",
        (
            AskQuestion("s", (AskOption("x"), AskOption("y"))),
            AskQuestion("m", (AskOption("x"), AskOption("y")), multi_select=True),
            AskQuestion("free"),
        ),
    )
    try:
        answers = decode_form_answers(ask, form)
    except ValueError as error:
        assert any(repr(name) in str(error) or name in str(error) for name in form)
    else:
        assert len(answers) == 3
        assert all(set(labels) <= {"x", "y"} for labels, _ in answers)
