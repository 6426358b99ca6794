"""The app context: everything that belongs to one Feishu (or Lark) app, and the registry of them.

A card is written with the credentials, the budgets and the CardKit scope of the app that sent it, a
callback is checked with that app's keys, and an image key is valid only for the app that uploaded it.
So each app gets its own ``FeishuClient`` (tenant token), its own budget per Open API (``BudgetTable``),
spent by its ``DeliveryScheduler`` (card writes: the outage breaker, ``paused_until``, fairness among its
cards) and its ``Admission`` (sends, creates, uploads), its own card writers (``CardWriters``: PATCH or
CardKit, per card), its own image uploads (their cache is keyed by content digest, which is only right
within one app) and its own CardKit scope fallback.

The task carries its app's name (``TaskState.app``, the ``task_card.app`` column); everything that acts
on a task looks the context up here. With no apps file there is exactly one app, ``default``, built from
``FP_FEISHU__*`` (or the sandbox), and nothing else differs from a single-app install.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from feishu_progress.config import DEFAULT_APP, CardKitSettings, FeishuSettings, RateSettings
from feishu_progress.errors import UnknownApp, UnknownRequestedApp
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.writers import CardWriters
from feishu_progress.ports import Clock
from feishu_progress.progress.admission import Admission
from feishu_progress.progress.scheduler import DeliveryScheduler
from feishu_progress.runtime.images import ImageKeys

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_APP",
    "AppContext",
    "AppRegistry",
    "AppSpec",
    "CardKitScope",
    "UnknownApp",
    "UnknownRequestedApp",
]


@dataclass(frozen=True, slots=True)
class AppSpec:
    """One app as configured, before anything is opened: name, keys and budgets."""

    name: str
    feishu: FeishuSettings
    rate: RateSettings
    cardkit: CardKitSettings


class CardKitScope:
    """Whether this app may create CardKit cards now: after a refusal for want of the scope, PATCH a while.

    Per app: one app without ``cardkit:card:write`` falls back alone.
    """

    def __init__(self, clock: Clock, recheck_seconds: float) -> None:
        self._clock = clock
        self._recheck = recheck_seconds
        self._no_cardkit_until = -1.0  # monotonic

    def allowed(self) -> bool:
        return self._clock.monotonic() >= self._no_cardkit_until

    def refused(self) -> None:
        self._no_cardkit_until = self._clock.monotonic() + self._recheck

    def seconds_left(self) -> float:
        return self._no_cardkit_until - self._clock.monotonic()


@dataclass
class AppContext:
    """One app, opened: its client, its budgets' two spenders, its card writers, its image uploads and
    its CardKit fallback."""

    spec: AppSpec
    client: FeishuClient
    scheduler: DeliveryScheduler
    admission: Admission
    writers: CardWriters
    images: ImageKeys
    cardkit_scope: CardKitScope

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def feishu(self) -> FeishuSettings:
        return self.spec.feishu


class AppRegistry:
    """Every app of the deployment by name, built once at start; ``default_name`` answers an omitted app."""

    def __init__(self, apps: Sequence[AppContext]) -> None:
        if not apps:
            raise ValueError("at least one app is needed")
        self._apps = {app.name: app for app in apps}
        self.default_name = default_app_name([app.name for app in apps])

    def get(self, name: str) -> AppContext:
        app = self._apps.get(name)
        if app is None:
            raise UnknownApp(name, self.names())
        return app

    def resolve(self, name: str | None) -> AppContext:
        """The app a request names, or the default one (UnknownRequestedApp when there is none such)."""
        if name is None:
            name = self.default_name
        app = None if name is None else self._apps.get(name)
        if app is None:
            raise UnknownRequestedApp(name or "", self.names())
        return app

    @property
    def first(self) -> AppContext:
        """The default app, else the first configured (what single-app views of the service show)."""
        name = self.default_name if self.default_name is not None else next(iter(self._apps))
        return self._apps[name]

    def names(self) -> list[str]:
        return list(self._apps)

    def __iter__(self) -> Iterator[AppContext]:
        return iter(list(self._apps.values()))

    def __len__(self) -> int:
        return len(self._apps)


def default_app_name(names: Sequence[str]) -> str | None:
    """``default`` when there is one, else the only app, else None (a request must name its app)."""
    if DEFAULT_APP in names:
        return DEFAULT_APP
    return names[0] if len(names) == 1 else None
