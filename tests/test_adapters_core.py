"""The agent SDKs stay optional: the core install (the service, the client, the adapters' shared part)
imports none of them; only an SDK's own adapter module does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from feishu_progress.adapters.claude import _answer_map
from feishu_progress.runtime.responses import Answer, AnswersPayload

REPO = Path(__file__).resolve().parent.parent
SDK_PACKAGES = ("agents", "langgraph", "langchain_core", "claude_agent_sdk")
CORE = ["feishu_progress.app", "feishu_progress.cli", "feishu_progress.client", "feishu_progress.adapters",
        "feishu_progress.adapters.sandbox_user", "feishu_progress.adapters.example_main"]  # fmt: skip


def test_the_core_imports_no_agent_sdk() -> None:
    probe = (
        f"import importlib, sys\nfor name in {CORE!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {SDK_PACKAGES!r}))"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": ""}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env=env, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_ask_user_question_answers_are_labels_joined_or_the_typed_text() -> None:
    answers = AnswersPayload(ask_id="q1", answers=[
        Answer(question="Which checks?", selected_labels=["Lint", "Types"], custom_input=""),
        Answer(question="Anything else?", selected_labels=[], custom_input="run the bench"),
    ])  # fmt: skip
    assert _answer_map(answers) == {"Which checks?": "Lint, Types", "Anything else?": "run the bench"}
