"""Settings from the environment (and `.env`), with the names README.md documents.

Nested groups use ``__``: ``FP_FEISHU__APP_ID``, ``FP_RATE__APP_PER_SECOND``... Settings are built
once at the entry point and passed explicitly; nothing reads the environment at import time.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, IPvAnyNetwork, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from feishu_progress.i18n.locales import FEISHU_LOCALES, SINGLE_LANGUAGE_LOCALES


def _blank_is_unset(value: object) -> object:
    # `FP_API__TOKEN=` in an env file means "not set", never "the empty token".
    if isinstance(value, str) and not value.strip():
        return None
    if isinstance(value, SecretStr) and not value.get_secret_value().strip():
        return None
    return value


class FeishuSettings(BaseModel):
    base_url: str = "https://open.feishu.cn"
    app_id: str | None = None
    app_secret: SecretStr | None = None
    encrypt_key: SecretStr | None = None
    verification_token: SecretStr | None = None
    mode: Literal["webhook", "ws"] = "webhook"
    timeout_seconds: float = Field(default=10.0, gt=0)

    _blank = field_validator("app_id", "app_secret", "encrypt_key", "verification_token", mode="before")(
        _blank_is_unset
    )

    @property
    def sandbox(self) -> bool:
        """No credentials: talk to the local sandbox instead of Feishu."""
        return not self.app_id or self.app_secret is None

    @field_validator("base_url")
    @classmethod
    def _strip_slash(cls, value: str) -> str:
        return value.rstrip("/")


DEFAULT_APP = "default"  # the app FP_FEISHU__* defines (the only one without FP_APPS_FILE)

MIN_CLUSTER_SECRET_CHARS = 32  # e.g. `openssl rand -hex 32`: guessing it must not be an option

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class HttpSettings(BaseModel):
    # None: 0.0.0.0 with Feishu credentials, 127.0.0.1 in sandbox mode (which has no callback keys of
    # Feishu's and is meant for one developer's machine). See ``Settings.bind_host``.
    host: str | None = None
    port: int = Field(default=8000, ge=0, le=65535)
    # Request bodies over 256 KiB (large event batches) handled at once; the rest wait their turn this
    # long, then get 429 with Retry-After: a flood of large batches cannot starve card clicks.
    large_bodies: int = Field(default=1, ge=1)
    large_body_wait_seconds: float = Field(default=10.0, gt=0)
    # How long event batches may hold the event loop in one of its turns; later ones wait for the next
    # turns, so timers, clicks and card writes run in between (a saturated loop's lag, web/load.py).
    batch_slice_seconds: float = Field(default=0.01, gt=0, le=1.0)


class AdminSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8001, ge=0, le=65535)
    token: SecretStr | None = None

    _blank = field_validator("token", mode="before")(_blank_is_unset)


class ApiSettings(BaseModel):
    token: SecretStr | None = None

    _blank = field_validator("token", mode="before")(_blank_is_unset)


class CardSettings(BaseModel):
    # cardkit: a card entity whose answer text streams (typewriter) and whose panels update whole;
    # patch: the message is PATCHed whole (no CardKit scope needed). A task whose CardKit create is
    # refused falls back to patch on its own.
    transport: Literal["cardkit", "patch"] = "cardkit"
    session_detail_url: str | None = None
    locales: Annotated[tuple[str, ...], NoDecode] = ("zh_cn", "en_us")

    @field_validator("locales", mode="before")
    @classmethod
    def _split_locales(cls, value: object) -> object:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("locales")
    @classmethod
    def _known_locales(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("FP_CARD__LOCALES needs at least one locale")
        for code in value:
            if code in SINGLE_LANGUAGE_LOCALES:
                if len(value) != 1:
                    raise ValueError(
                        f"{code!r} has no Feishu per-viewer locale code: it can only be the card's single "
                        "language (FP_CARD__LOCALES=tr)"
                    )
            elif code not in FEISHU_LOCALES:
                raise ValueError(f"unknown card locale {code!r}; Feishu accepts {', '.join(FEISHU_LOCALES)}")
        return value

    @field_validator("session_detail_url")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("FP_CARD__SESSION_DETAIL_URL must be an http(s) URL template with {session_id}")
        return value or None


class ApiLimit(BaseModel):
    """One Open API's app budget (Feishu counts each API on its own, per app and tenant)."""

    per_second: float = Field(default=50, gt=0)
    per_minute: float = Field(default=1000, gt=0)


class ApiLimits(BaseModel):
    """FP_RATE__API__<API>__PER_SECOND / __PER_MINUTE: every Open API the service calls, with Feishu's
    documented limit (1000/min and 50/s for each of them; the token endpoint's is not documented and
    gets the same). The names are the budgets' names (``cluster/limits.py`` ``OpenApi``)."""

    send: ApiLimit = ApiLimit()  # im/v1 message create
    reply: ApiLimit = ApiLimit()  # im/v1 message reply
    patch: ApiLimit = ApiLimit()  # im/v1 message PATCH
    image: ApiLimit = ApiLimit()  # im/v1 image upload
    card_create: ApiLimit = ApiLimit()  # cardkit/v1 card create
    card_update: ApiLimit = ApiLimit()  # cardkit/v1 full card update
    card_settings: ApiLimit = ApiLimit()  # cardkit/v1 card settings (streaming on/off)
    card_content: ApiLimit = ApiLimit()  # cardkit/v1 element content (streamed text)
    token: ApiLimit = ApiLimit()  # auth/v3 tenant_access_token


class RateSettings(BaseModel):
    """FP_RATE__*: the one budget table. Each API spends its own budget (``api``), and
    ``app_per_second`` / ``app_per_minute`` cap every one of them (an operator sharing the app's quota
    lowers these two and every call the service makes stays below them, whatever the transport)."""

    app_per_second: float = Field(default=50, gt=0)
    app_per_minute: float = Field(default=1000, gt=0)
    message_interval_ms: int = Field(default=250, ge=200)  # Feishu allows 5 QPS per message
    # A create waits at most this long for its send (or card create) budget, then answers 503 with a
    # Retry-After from the budget; the runtime's retry with its Idempotency-Key finds the same task.
    create_wait_seconds: float = Field(default=10, gt=0)
    api: ApiLimits = ApiLimits()

    def for_api(self, api: str) -> RateSettings:
        """The budget of one Open API: its own limit, capped by ``app_per_*`` (KeyError: no such API)."""
        own = getattr(self.api, api) if api in ApiLimits.model_fields else None
        if not isinstance(own, ApiLimit):
            raise KeyError(f"no budget for Open API {api!r}")
        return self.model_copy(
            update={
                "app_per_second": min(self.app_per_second, own.per_second),
                "app_per_minute": min(self.app_per_minute, own.per_minute),
            }
        )

    @classmethod
    def lifted(cls, per_second: float, per_minute: float) -> RateSettings:
        """Every API (and the cap) at the same budget: benchmarks and tests that lift Feishu's limits."""
        limit = ApiLimit(per_second=per_second, per_minute=per_minute)
        apis = ApiLimits(**dict.fromkeys(ApiLimits.model_fields, limit))
        return cls(app_per_second=per_second, app_per_minute=per_minute, api=apis)


class CardKitSettings(BaseModel):
    """FP_CARDKIT__*: pacing of CardKit cards (docs/feishu-platform.md §4)."""

    # Feishu closes streaming 600 s after it was last opened; re-open well before (updates after the
    # close are sometimes dropped without an error).
    streaming_window_seconds: float = Field(default=540, gt=0)
    # Between two writes of one card: text moves this often (Feishu allows 10 operations/s per card; a
    # write is one operation, two when streaming is switched on or off with it).
    text_interval_ms: int = Field(default=150, ge=100)
    # Status, tools, subagents and buttons are rewritten whole at most this often per card.
    panel_interval_ms: int = Field(default=1500, ge=200)
    # Deprecated (FP_RATE__API__CARD_*__PER_* replace them): when set, the budget of each CardKit API
    # (create, update, settings, content), still capped by FP_RATE__APP_PER_*; start-up says so.
    app_per_second: float | None = Field(default=None, gt=0)
    app_per_minute: float | None = Field(default=None, gt=0)
    # After a create refused for want of the scope, tasks use PATCH; CardKit is tried again this much later.
    scope_recheck_seconds: float = Field(default=600, gt=0)
    # The client's typewriter: characters per step and ms per step ("fast": a newer text shows the
    # rest of the old one at once instead of queueing behind it).
    print_frequency_ms: int = Field(default=40, ge=10, le=1000)
    print_step: int = Field(default=2, ge=1, le=50)


CARDKIT_APIS = ("card_create", "card_update", "card_settings", "card_content")


def _unless_set(limit: ApiLimit, overrides: dict[str, float]) -> ApiLimit:
    """``limit`` with the deprecated values, except where the new setting was given explicitly."""
    return limit.model_copy(update={k: v for k, v in overrides.items() if k not in limit.model_fields_set})


class TaskSettings(BaseModel):
    stale_after: float = Field(default=1800, gt=0, description="seconds without an event before 失去联系")
    # Live tasks (cards in memory) this process holds at most; a create past it is a 503 with Retry-After
    # (each live task is 5 KB idle and up to ~0.4 MiB at the per-task caps).
    max_live: int = Field(default=10_000, gt=0)


class CallbackSettings(BaseModel):
    timestamp_window_seconds: int = Field(default=300, gt=0)
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    # A slow-body client must not hold a connection for minutes (Feishu sends the whole body at once).
    body_timeout_seconds: float = Field(default=10.0, gt=0)
    allow_chat_members: bool = False
    dedupe_ttl_seconds: int = Field(default=24 * 3600, gt=0)


MAX_IMAGE_BYTES = 10 * 1024 * 1024  # Feishu refuses larger uploads (234006)


class ImagesSettings(BaseModel):
    """Where the images of generate_image / edit_image results may come from, and how many at once."""

    # Local image_path values are read only beneath this directory; unset: every local path is refused.
    root: Path | None = None
    # true: image_url may point at any address (loopback, private, link-local, metadata...).
    allow_private_urls: bool = False
    # Private networks image_url may reach anyway (an internal CDN), e.g. 10.20.0.0/16,fd00:1::/64.
    allowed_networks: Annotated[tuple[IPvAnyNetwork, ...], NoDecode] = ()
    fetch_timeout_seconds: float = Field(default=10.0, gt=0)
    # An image_url server that has not sent its response head this long after the request is given up
    # on, and so is one whose body comes slower than this on average (after its first 2 s): a slow
    # server frees its fetch slot in seconds, not at fetch_timeout_seconds.
    fetch_first_byte_seconds: float = Field(default=5.0, gt=0)
    fetch_min_bytes_per_second: int = Field(default=16 * 1024, ge=1)
    # image_url fetches have slots of their own (not the upload slots local images use), and one task
    # holds at most fetch_per_task of them: its slow URLs cannot queue another task's images.
    fetch_concurrency: int = Field(default=8, ge=1, le=64)
    fetch_per_task: int = Field(default=2, ge=1, le=64)
    max_redirects: int = Field(default=3, ge=0, le=10)
    max_bytes: int = Field(default=MAX_IMAGE_BYTES, ge=1, le=MAX_IMAGE_BYTES)
    # At most this many images are read and uploaded at once (a fetched image_url takes one of these
    # once fetched, for its upload): with fetch_concurrency it bounds the bodies in memory.
    concurrency: int = Field(default=4, ge=1, le=64)
    max_per_call: int = Field(default=9, ge=0, le=9)  # the card shows at most 9 per call
    max_per_task: int = Field(default=50, ge=0)

    _blank = field_validator("root", mode="before")(_blank_is_unset)

    @field_validator("allowed_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        return value


# A bare SQL identifier: the names are quoted by SQLAlchemy, this only keeps typos and dotted names out.
TABLE_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class SubagentsSettings(BaseModel):
    """Attach mode: the running-subagent query reads the agent's own database (read-only) instead of ours.

    Unset: subagent_* events are stored in our copy of the seed's tables, as before.
    """

    # MySQL/MariaDB or SQLite SQLAlchemy async URL; give it a user with SELECT only.
    database_url: str | None = None
    execution_table: str = Field(default="subagent_execution", pattern=TABLE_NAME_PATTERN)
    session_table: str = Field(default="session", pattern=TABLE_NAME_PATTERN)

    _blank = field_validator("database_url", mode="before")(_blank_is_unset)

    @property
    def attached(self) -> bool:
        """True when the agent's database holds the subagent rows."""
        return self.database_url is not None


def default_instance_id() -> str:
    """``<hostname>-<pid>``: unique per process on a host, readable in logs and /admin/cards."""
    return f"{socket.gethostname()}-{os.getpid()}"[:64]


class ClusterSettings(BaseModel):
    """Cluster mode (FP_REDIS_URL set): how instances keep, hand over and take over cards."""

    # How peers reach this instance's public listener to forward a request for a card it writes.
    # Unset: http://<hostname or the bound address>:<FP_HTTP__PORT>.
    advertise_url: str | None = None
    heartbeat_seconds: float = Field(default=1.0, gt=0)
    lease_seconds: float = Field(default=4.0, gt=0)
    # Open API calls time out this fast in cluster mode: a new owner waits this long after taking a
    # card from a dead instance, so a PATCH the dead one had in flight can no longer land after its own.
    write_timeout_seconds: float = Field(default=2.5, gt=0)
    # A click handed to the card's writer waits this long for its answer; past it this instance records
    # the click itself (the writer applies it from the log). Feishu waits 3 s for the whole answer, and
    # with Redis down the dedupe and the record take their share: 1.5 s left too little (a chaos run
    # answered 操作失败 past the 2.5 s deadline).
    forward_timeout_seconds: float = Field(default=1.0, gt=0)
    # FP_CLUSTER__SECRET: what instances sign the requests they send each other with (cluster/trust.py).
    # Required in cluster mode; the same random value on every instance, and never given to a runtime.
    secret: SecretStr | None = None

    _blank = field_validator("secret", mode="before")(_blank_is_unset)

    @field_validator("advertise_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("FP_CLUSTER__ADVERTISE_URL must be an http(s) URL")
        return value.rstrip("/") if value else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FP_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
    )

    database_url: str = "sqlite+aiosqlite:///./feishu_progress.db"
    feishu: FeishuSettings = FeishuSettings()
    http: HttpSettings = HttpSettings()
    admin: AdminSettings = AdminSettings()
    api: ApiSettings = ApiSettings()
    card: CardSettings = CardSettings()
    cardkit: CardKitSettings = CardKitSettings()
    rate: RateSettings = RateSettings()
    task: TaskSettings = TaskSettings()
    callback: CallbackSettings = CallbackSettings()
    images: ImagesSettings = ImagesSettings()
    subagents: SubagentsSettings = SubagentsSettings()
    redis_url: str | None = None  # FP_REDIS_URL: cluster mode
    # FP_APPS_FILE: a TOML file of several Feishu/Lark apps (apps_file.py); none: FP_FEISHU__* only.
    apps_file: str | None = None
    # FP_PUBLIC_URL: where Feishu reaches this service (the console callback URL: this + /feishu/callback).
    public_url: str | None = None
    instance_id: str = Field(default_factory=default_instance_id, min_length=1, max_length=64)
    cluster: ClusterSettings = ClusterSettings()
    log_json: bool = False
    log_level: str = "INFO"

    _blank_public = field_validator("public_url", "apps_file", mode="before")(_blank_is_unset)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("FP_PUBLIC_URL must be an http(s) URL, e.g. https://bot.example.com")
        return value.rstrip("/") if value else None

    @property
    def sandbox_mode(self) -> bool:
        """No Feishu credentials and no apps file: cards go to an in-process sandbox."""
        return self.feishu.sandbox and self.apps_file is None

    @model_validator(mode="after")
    def _fold_deprecated_cardkit_budget(self) -> Settings:
        # FP_CARDKIT__APP_PER_* keeps working as the CardKit APIs' own budgets (one table, one meaning:
        # FP_RATE__APP_PER_* still caps them); ``deprecations`` tells the operator at start-up.
        cardkit = self.cardkit
        if cardkit.app_per_second is None and cardkit.app_per_minute is None:
            return self
        overrides: dict[str, float] = {}
        if cardkit.app_per_second is not None:
            overrides["per_second"] = cardkit.app_per_second
        if cardkit.app_per_minute is not None:
            overrides["per_minute"] = cardkit.app_per_minute
        apis = self.rate.api
        changed = {name: _unless_set(getattr(apis, name), overrides) for name in CARDKIT_APIS}
        self.rate = self.rate.model_copy(update={"api": apis.model_copy(update=changed)})
        return self

    def deprecations(self) -> list[str]:
        """Settings still honoured under an old name: said once at start-up."""
        notes: list[str] = []
        if self.cardkit.app_per_second is not None or self.cardkit.app_per_minute is not None:
            notes.append(
                "FP_CARDKIT__APP_PER_SECOND / FP_CARDKIT__APP_PER_MINUTE are deprecated: they set the budget "
                "of each CardKit API (still capped by FP_RATE__APP_PER_*); use "
                "FP_RATE__API__CARD_UPDATE__PER_SECOND (and CARD_CONTENT, CARD_SETTINGS, CARD_CREATE) instead"
            )
        return notes

    @property
    def bind_host(self) -> str:
        """FP_HTTP__HOST, else loopback in sandbox mode, else every address."""
        if self.http.host is not None:
            return self.http.host
        return "127.0.0.1" if self.sandbox_mode else "0.0.0.0"

    def _cluster_secret_problems(self) -> list[str]:
        secret = self.cluster.secret
        if secret is None:
            return [
                "cluster mode (FP_REDIS_URL) needs FP_CLUSTER__SECRET: instances authenticate the clicks "
                "and requests they send each other with it (the same random value on every instance)"
            ]
        if len(secret.get_secret_value()) < MIN_CLUSTER_SECRET_CHARS:
            return [f"FP_CLUSTER__SECRET must be at least {MIN_CLUSTER_SECRET_CHARS} characters"]
        return []

    def serving_problems(self) -> list[str]:
        """Why this configuration must not serve (an open door by default is not a default we ship)."""
        problems: list[str] = []
        if self.redis_url and not self.database_url.startswith(("mysql", "mariadb")):
            problems.append(
                "cluster mode (FP_REDIS_URL) needs MySQL/MariaDB in FP_DATABASE_URL: several instances "
                "cannot share a SQLite file"
            )
        if self.redis_url:
            problems.extend(self._cluster_secret_problems())
        if self.redis_url and self.cluster.lease_seconds <= 2 * self.cluster.heartbeat_seconds:
            problems.append("FP_CLUSTER__LEASE_SECONDS must exceed twice FP_CLUSTER__HEARTBEAT_SECONDS")
        feishu = self.feishu
        if self.sandbox_mode:
            if self.bind_host not in LOOPBACK_HOSTS and self.api.token is None:
                problems.append(
                    f"sandbox mode on FP_HTTP__HOST={self.bind_host} is reachable from the network: "
                    "set FP_API__TOKEN (or bind 127.0.0.1)"
                )
            return problems
        if self.api.token is None:
            problems.append("FP_API__TOKEN is required when talking to Feishu (runtimes must present it)")
        if (
            not feishu.sandbox  # with an apps file, FP_FEISHU__* may define no app (the file checks its own)
            and feishu.mode == "webhook"
            and feishu.encrypt_key is None
            and feishu.verification_token is None
        ):
            problems.append(
                "card callbacks would be unauthenticated: set FP_FEISHU__ENCRYPT_KEY (signed, encrypted "
                "callbacks; best) or at least FP_FEISHU__VERIFICATION_TOKEN, or use FP_FEISHU__MODE=ws"
            )
        return problems


TEST_PREFIX = "FP_TEST_"  # the test suite's own variables (tests/conftest.py), not settings


def setting_names() -> list[str]:
    """Every FP_* variable the settings read (nested groups joined with ``__``)."""
    return _names_of(Settings, "FP_")


def _names_of(model: type[BaseModel], prefix: str) -> list[str]:
    names: list[str] = []
    for name, info in model.model_fields.items():
        group = info.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):  # a group (FP_RATE__API__SEND__...)
            names.extend(_names_of(group, f"{prefix}{name.upper()}__"))
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


def unknown_variables(environ: Mapping[str, str], referenced: Iterable[str] = ()) -> list[str]:
    """FP_* variables in ``environ`` that no setting reads (a typo is otherwise silently ignored).

    ``referenced``: names the apps file points at for its secrets (``apps_file.referenced_variables``).
    """
    known = set(setting_names()) | {name.upper() for name in referenced}
    return sorted(
        name
        for name in environ
        if name.upper().startswith("FP_")
        and not name.upper().startswith(TEST_PREFIX)
        and name.upper() not in known
    )
