"""Live cards and the delivery scheduler that paces and budgets their PATCHes."""

from feishu_progress.progress.budget import AppBudget
from feishu_progress.progress.live_card import BuildCard, CardContext, CardState, LiveCard
from feishu_progress.progress.registry import LiveCardRegistry
from feishu_progress.progress.scheduler import (
    BackoffPolicy,
    Deliverable,
    Delivery,
    DeliveryScheduler,
    FlushReport,
)

__all__ = [
    "AppBudget",
    "BackoffPolicy",
    "BuildCard",
    "CardContext",
    "CardState",
    "Deliverable",
    "Delivery",
    "DeliveryScheduler",
    "FlushReport",
    "LiveCard",
    "LiveCardRegistry",
]
