"""Title rules of running subagents (seed 002 §4.1.2, §5.2)."""

from __future__ import annotations

from feishu_progress.subagents.titles import (
    MAX_TITLE_CHARS,
    clean_title,
    running_subagent_title,
    strip_auto_prefix,
)


def test_auto_prefix_is_stripped() -> None:
    assert strip_auto_prefix("后台子代理(explorer): 排查卡片进度链路") == "排查卡片进度链路"
    assert strip_auto_prefix("后台子代理（worker）：实现展示") == "实现展示"
    assert (
        strip_auto_prefix("调研 后台子代理(explorer): x") == "调研 后台子代理(explorer): x"
    )  # only a prefix


def test_control_characters_become_spaces_and_whitespace_collapses() -> None:
    assert clean_title("排查\n卡片\t\t进度\x00链路\x7f  ") == "排查 卡片 进度 链路"
    assert clean_title("  a \u3000 b  ") == "a b"  # ideographic space is whitespace too


def test_empty_after_cleaning_is_none() -> None:
    assert clean_title(None) is None
    assert clean_title("") is None
    assert clean_title(" \n\x01\t ") is None


def test_exactly_forty_characters_are_kept() -> None:
    forty = "字" * MAX_TITLE_CHARS
    assert clean_title(forty) == forty


def test_longer_titles_are_cut_at_forty_characters_plus_ellipsis() -> None:
    cut = clean_title("字" * 41)
    assert cut == "字" * 40 + "..."
    assert cut is not None and len(cut) == 43


def test_cut_does_not_leave_a_trailing_space() -> None:
    assert clean_title("a" * 39 + " " + "b" * 10) == "a" * 39 + "..."


def test_emoji_survive_and_count_as_one_character() -> None:
    assert clean_title("🐱 猫猫调研") == "🐱 猫猫调研"
    assert clean_title("🐱" * 41) == "🐱" * 40 + "..."


def test_cut_never_splits_an_emoji_sequence_or_flag() -> None:
    family = "👨\u200d👩\u200d👧"  # five code points shown as one emoji
    assert clean_title("a" * 38 + family) == "a" * 38 + "..."
    thumbs = "👍🏽"  # emoji + skin tone modifier
    assert clean_title("a" * 39 + thumbs + "z") == "a" * 39 + "..."
    flag = "🇨🇳"
    assert clean_title("a" * 39 + flag) == "a" * 39 + "..."
    assert clean_title("a" * 38 + flag + "zz") == "a" * 38 + flag + "..."


def test_running_title_prefers_the_child_session_title() -> None:
    assert running_subagent_title("后台子代理(explorer): 排查链路", "任务描述", 12, 3) == "排查链路"
    assert running_subagent_title("自定义标题", "任务描述", 12, 3) == "自定义标题"


def test_running_title_falls_back_to_task_description_then_label() -> None:
    assert running_subagent_title(None, "调研\n飞书限流", 12, 3) == "调研 飞书限流"
    assert running_subagent_title("  ", "调研", 12, 3) == "调研"
    # Seed 002 §4.1.2: a title that is only the prefix is still the source; nothing is left of it.
    assert running_subagent_title("后台子代理(explorer): ", "调研", 12, 3) == "子代理 #12"
    assert running_subagent_title("后台子代理（worker）：  ", None, None, 4) == "子代理 #4"
    assert running_subagent_title("\x01\x02", "调研", 12, 3) == "子代理 #12"  # not blank, nothing left
    assert running_subagent_title(None, None, 12, 3) == "子代理 #12"
    assert running_subagent_title("", " ", None, 3) == "子代理 #3"


def test_running_title_is_cut_after_the_prefix_is_removed() -> None:
    title = running_subagent_title("后台子代理(worker): " + "实" * 50, None, 1, 1)
    assert title == "实" * 40 + "..."
