"""``FP_APPS_FILE``: several Feishu/Lark apps in one deployment, one TOML table per app.

```toml
[apps.research]
app_id = "cli_a1..."
app_secret_env = "FP_APP_RESEARCH_SECRET"      # secrets by env reference: the file can be a ConfigMap
encrypt_key_env = "FP_APP_RESEARCH_ENCRYPT_KEY"
verification_token_env = "FP_APP_RESEARCH_VERIFICATION_TOKEN"
domain = "feishu"                              # "feishu" | "lark" | a base URL (the sandbox, a proxy)
mode = "webhook"                               # or "ws"
[apps.research.rate]                           # optional: caps every API of this app
app_per_second = 20
app_per_minute = 600
```

Everything wrong is refused at start with the app and the key named: an unknown key, a missing or empty
env var, a duplicate app_id, a bad domain or mode. ``FP_FEISHU__*`` (when it has credentials) stays the
app named ``default``. Without the file there is only that app (or the sandbox), exactly as before.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from feishu_progress.apps import AppSpec
from feishu_progress.config import DEFAULT_APP, CardKitSettings, FeishuSettings, RateSettings, Settings
from feishu_progress.errors import ConfigError

DOMAINS = {"feishu": "https://open.feishu.cn", "lark": "https://open.larksuite.com"}
MODES = ("webhook", "ws")
APP_KEYS = frozenset(
    {"app_id", "app_secret_env", "encrypt_key_env", "verification_token_env", "domain", "mode", "rate"}
)
RATE_KEYS = frozenset({"app_per_second", "app_per_minute"})
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # a URL path segment and task_card.app (VARCHAR(64))


def app_specs(settings: Settings, environ: Mapping[str, str] | None = None) -> list[AppSpec]:
    """The apps of this deployment (ConfigError naming the app and the key for a bad apps file)."""
    default = AppSpec(DEFAULT_APP, settings.feishu, settings.rate, settings.cardkit)
    if settings.apps_file is None:
        return [default]
    specs = load_apps_file(Path(settings.apps_file), settings, os.environ if environ is None else environ)
    if not settings.feishu.sandbox:  # FP_FEISHU__* has credentials: it is still the app named default
        if any(spec.name == DEFAULT_APP for spec in specs):
            raise ConfigError(
                f"{settings.apps_file}: app 'default' is also defined by FP_FEISHU__*: rename one of them"
            )
        specs.insert(0, default)
    _refuse_duplicates(settings.apps_file, specs)
    return specs


def referenced_variables(settings: Settings) -> set[str]:
    """The env var names the apps file's ``*_env`` keys point at (empty when there is no readable file)."""
    if settings.apps_file is None:
        return set()
    try:
        apps = tomllib.loads(Path(settings.apps_file).read_text(encoding="utf-8")).get("apps")
    except (OSError, tomllib.TOMLDecodeError):
        return set()  # the start refuses it with the reason (load_apps_file)
    tables = apps.values() if isinstance(apps, dict) else ()
    return {
        value
        for table in tables
        if isinstance(table, dict)
        for key, value in table.items()
        if key.endswith("_env") and isinstance(value, str)
    }


def load_apps_file(path: Path, settings: Settings, environ: Mapping[str, str]) -> list[AppSpec]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"FP_APPS_FILE={path}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"FP_APPS_FILE={path}: not valid TOML ({exc})") from None
    unknown = sorted(set(document) - {"apps"})
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (only [apps.<name>] tables belong here)")
    apps = document.get("apps")
    if not isinstance(apps, dict) or not apps:
        raise ConfigError(f"{path}: no [apps.<name>] table")
    return [_spec(path, name, table, settings, environ) for name, table in apps.items()]


def _spec(path: Path, name: str, table: Any, settings: Settings, environ: Mapping[str, str]) -> AppSpec:
    where = f"{path}: app {name!r}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: the name must be lowercase letters, digits, '-' or '_' (at most 64)")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table ([apps.{name}])")
    unknown = sorted(set(table) - APP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(APP_KEYS))})")
    app_id = table.get("app_id")
    if not isinstance(app_id, str) or not app_id.strip():
        raise ConfigError(f"{where}: app_id is required (a string, cli_...)")
    mode = table.get("mode", "webhook")
    if mode not in MODES:
        raise ConfigError(f"{where}: mode must be one of {', '.join(MODES)}, not {mode!r}")
    feishu = FeishuSettings(
        base_url=_base_url(where, table.get("domain", "feishu")),
        app_id=app_id,
        app_secret=_secret(where, table, "app_secret_env", environ, required=True),
        encrypt_key=_secret(where, table, "encrypt_key_env", environ),
        verification_token=_secret(where, table, "verification_token_env", environ),
        mode=mode,
        timeout_seconds=settings.feishu.timeout_seconds,
    )
    if mode == "webhook" and feishu.encrypt_key is None and feishu.verification_token is None:
        raise ConfigError(
            f"{where}: card callbacks would be unauthenticated: set encrypt_key_env (best) or "
            'verification_token_env, or use mode = "ws"'
        )
    rate, cardkit = _rates(where, table.get("rate"), settings)
    return AppSpec(name, feishu, rate, cardkit)


def _secret(
    where: str, table: Mapping[str, Any], key: str, environ: Mapping[str, str], *, required: bool = False
) -> SecretStr | None:
    variable = table.get(key)
    if variable is None:
        if required:
            raise ConfigError(f"{where}: {key} is required (the name of the env var holding the secret)")
        return None
    if not isinstance(variable, str) or not variable:
        raise ConfigError(f"{where}: {key} must name an environment variable")
    value = environ.get(variable, "")
    if not value.strip():
        raise ConfigError(f"{where}: {key} names {variable}, which is not set (or empty)")
    return SecretStr(value)


def _base_url(where: str, domain: Any) -> str:
    if isinstance(domain, str) and domain in DOMAINS:
        return DOMAINS[domain]
    if isinstance(domain, str) and domain.startswith(("http://", "https://")):
        return domain.rstrip("/")
    raise ConfigError(f'{where}: domain must be "feishu", "lark" or an http(s) base URL, not {domain!r}')


def _rates(where: str, rate: Any, settings: Settings) -> tuple[RateSettings, CardKitSettings]:
    """This app's budgets: FP_RATE__*, each API capped by its [rate] table."""
    if rate is None:
        return settings.rate, settings.cardkit
    if not isinstance(rate, dict):
        raise ConfigError(f"{where}: rate must be a table ([apps.<name>.rate])")
    unknown = sorted(set(rate) - RATE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key 'rate.{unknown[0]}' (known: {', '.join(sorted(RATE_KEYS))})")
    caps: dict[str, float] = {}
    for key, value in rate.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{where}: rate.{key} must be a number above 0, not {value!r}")
        caps[key] = float(value)
    # FP_RATE__APP_PER_* caps every API of the app (the one budget table): capping it caps CardKit too.
    capped = {key: min(getattr(settings.rate, key), value) for key, value in caps.items()}
    return settings.rate.model_copy(update=capped), settings.cardkit


def _refuse_duplicates(path: str, specs: list[AppSpec]) -> None:
    seen: dict[str, str] = {}
    for spec in specs:
        app_id = spec.feishu.app_id or ""
        if app_id in seen:
            raise ConfigError(f"{path}: app {spec.name!r}: app_id {app_id!r} is app {seen[app_id]!r}'s too")
        seen[app_id] = spec.name
