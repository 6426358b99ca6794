"""One error tree for the whole service."""

from __future__ import annotations

from collections.abc import Sequence


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


class RequestRejected(FeishuProgressError):
    """A request is refused as it stands (the caller must change it); ``location`` names the field."""

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message


class EventRejected(RequestRejected):
    """A runtime event batch is refused; ``location`` names the offending field."""


class TooManyImages(RequestRejected):
    """The task holds as many images as a task may: the runtime's upload is refused."""


REUSED_KEY = "this Idempotency-Key came with another request before: a new request needs a new key"


class UnknownApp(FeishuProgressError):
    """A request or a stored task names an app this deployment does not configure."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(f"unknown app {name!r}; known apps: {', '.join(known)}")
        self.name = name
        self.known = tuple(known)


class UnknownRequestedApp(UnknownApp):
    """A request names an app this deployment does not configure: the caller's to fix (unlike a stored
    task's app that is no longer configured, which is the operator's)."""


FIRST_CARD_RETRY_AFTER = 2  # seconds a runtime should wait before creating again when Feishu failed


class FirstCardFailed(FeishuProgressError):
    """Feishu did not take the first card after every retry (or its budget was busy past the bound);
    nothing of the task remains but a row kept for its Idempotency-Key."""

    def __init__(self, message: str, retry_after: int = FIRST_CARD_RETRY_AFTER) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UploadsBusy(FeishuProgressError):
    """Every upload slot stayed taken for the caller's ``max_wait``: nothing was read (answer 429)."""


class TooManyLive(FeishuProgressError):
    """This process holds FP_TASK__MAX_LIVE live tasks: a new one must wait (503 with Retry-After)."""


class UnknownTask(FeishuProgressError):
    """No task with that session id."""

    def __init__(self, session_id: int) -> None:
        super().__init__(f"no task {session_id}")
        self.session_id = session_id


class TaskConflict(FeishuProgressError):
    """The request contradicts the task's state (see the two kinds below)."""


class TaskExists(TaskConflict):
    """A new task's session id or Idempotency-Key is already taken."""


class TaskFinished(TaskConflict):
    """The task has finished: it takes no more events or images."""


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
