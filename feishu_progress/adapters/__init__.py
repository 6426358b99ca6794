"""Adapters from agent SDKs to one live card: their streams become runtime events, the card's clicks
drive the agent (approve / deny a tool call, answer its question, cancel the run).

One module per SDK, each importing its SDK, each behind an extra:

    feishu_progress.adapters.openai_agents   pip install "feishu-progress[openai-agents]"
    feishu_progress.adapters.langgraph       pip install "feishu-progress[langgraph]"
    feishu_progress.adapters.claude          pip install "feishu-progress[claude]"

What they share (no SDK import) is ``card_session.CardSession``: one task's events out through the HTTP
client (``feishu_progress.client``), its user actions in through the actions long-poll.
"""

from feishu_progress.adapters.card_session import (
    DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    Approval,
    CardSession,
    Decision,
    open_card,
)

__all__ = ["DEFAULT_APPROVAL_TIMEOUT_SECONDS", "Approval", "CardSession", "Decision", "open_card"]
