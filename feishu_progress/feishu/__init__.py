"""Feishu Open API edge: the client, error classification and the card writers (the port's adapters)."""

from feishu_progress.feishu.client import FeishuClient, TokenCache
from feishu_progress.feishu.errors import classify
from feishu_progress.feishu.writers import CardWriters

__all__ = ["CardWriters", "FeishuClient", "TokenCache", "classify"]
