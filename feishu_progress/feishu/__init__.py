"""Feishu Open API edge: the client, error classification and the port adapters."""

from feishu_progress.feishu.client import FeishuClient, TokenCache
from feishu_progress.feishu.errors import classify
from feishu_progress.feishu.sink import FeishuCardSink

__all__ = ["FeishuCardSink", "FeishuClient", "TokenCache", "classify"]
