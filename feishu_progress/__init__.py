"""feishu-progress: one live Feishu card per AI agent task."""

__version__ = "0.1.0"
