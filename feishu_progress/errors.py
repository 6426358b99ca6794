"""One error tree for the whole service."""

from __future__ import annotations


class FeishuProgressError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(FeishuProgressError):
    """The configuration cannot work (unknown locale, missing credential outside sandbox...)."""


class StartupRefused(FeishuProgressError):
    """The service will not start; the message is one line naming the setting (or holder) and the fix."""


class FeishuAPIError(FeishuProgressError):
    """A Feishu Open API call answered with a non-zero ``code`` or a non-2xx status."""

    def __init__(
        self,
        code: int,
        msg: str,
        *,
        http_status: int = 200,
        log_id: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"Feishu API error {code}: {msg}" + (f" (log_id {log_id})" if log_id else ""))
        self.code = code
        self.msg = msg
        self.http_status = http_status
        self.log_id = log_id
        self.retry_after = retry_after


class FeishuTransportError(FeishuProgressError):
    """The request never got a Feishu answer: timeout, connection refused, reset."""


class CallbackRejected(FeishuProgressError):
    """A callback request is refused; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class EventRejected(FeishuProgressError):
    """A runtime event batch is refused; ``location`` names the offending field."""

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message


REUSED_KEY = "this Idempotency-Key came with another request before: a new request needs a new key"


class TooManyLive(FeishuProgressError):
    """This process holds FP_TASK__MAX_LIVE live tasks: a new one must wait (503 with Retry-After)."""


class UnknownTask(FeishuProgressError):
    """No task with that session id."""


class TaskConflict(FeishuProgressError):
    """The request contradicts the task's state: events after it finished, an id already taken."""


class ImageRefused(FeishuProgressError):
    """An image source was not read: ``reason`` is a short kind (``outside_root``, ``private_address``...).

    It deliberately never carries the path or URL, so neither a log line nor a card can reveal which
    local paths exist or what an internal address answered.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"image refused: {reason}")
        self.reason = reason


class OwnedElsewhere(FeishuProgressError):
    """Cluster mode: another live instance writes this card; ``address`` reaches it."""

    def __init__(self, session_id: int, owner: str, address: str | None) -> None:
        super().__init__(f"task {session_id} is written by {owner}")
        self.owner = owner
        self.address = address


class NotWritableHere(FeishuProgressError):
    """Cluster mode: this instance may not change the task right now (its lease lapsed): retry."""


class ForwardFailed(FeishuProgressError):
    """Cluster mode: the card's writer did not answer in time (paused, dying): answer a retryable 503."""
