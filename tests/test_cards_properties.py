"""Property tests: any input gives a valid card within Feishu's limits and with no foreign tag."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feishu_progress.cards.builder import build_degraded_card, build_progress_card
from feishu_progress.cards.callback_contract import decode_form_answers
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
from tests.test_cards_builder import foreign_tags

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
    CardModel,
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


def check(card: dict[str, Any]) -> None:
    assert card_problems(card) == []
    assert card_bytes(card) <= TARGET_BYTES
    assert foreign_tags(card) == []


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
    model = CardModel(
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
    model = CardModel(
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
