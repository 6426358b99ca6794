"""A local stand-in for the Feishu Open API that enforces its documented limits (tests, demo, bench)."""

from feishu_progress.sandbox.faults import Faults
from feishu_progress.sandbox.server import RunningSandbox, create_sandbox_app, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig, SandboxMessage, SandboxState

__all__ = [
    "Faults",
    "RunningSandbox",
    "SandboxConfig",
    "SandboxMessage",
    "SandboxState",
    "create_sandbox_app",
    "run_sandbox",
]
