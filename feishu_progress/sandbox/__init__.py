"""A local stand-in for the Feishu Open API that enforces its documented limits (tests, demo, bench)."""

from feishu_progress.sandbox.cardkit import CardEntity, CardKit, CardKitRecord, StreamUpdate, UpdateKind
from feishu_progress.sandbox.faults import Faults
from feishu_progress.sandbox.server import RunningSandbox, create_sandbox_app, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig, SandboxMessage, SandboxState

__all__ = [
    "CardEntity",
    "CardKit",
    "CardKitRecord",
    "Faults",
    "RunningSandbox",
    "SandboxConfig",
    "SandboxMessage",
    "SandboxState",
    "StreamUpdate",
    "UpdateKind",
    "create_sandbox_app",
    "run_sandbox",
]
