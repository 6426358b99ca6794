"""The data layer: models, the Database (engine + sessions), repositories and migrations."""

from feishu_progress.db.engine import Database
from feishu_progress.db.repo import (
    ActionRecord,
    ActionRepository,
    CallbackDedupeRepository,
    SubagentRepository,
    TaskRecord,
    TaskRepository,
)

__all__ = [
    "ActionRecord",
    "ActionRepository",
    "CallbackDedupeRepository",
    "Database",
    "SubagentRepository",
    "TaskRecord",
    "TaskRepository",
]
