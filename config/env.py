"""How settings are read from the environment: typed readers, the project's paths and the secret-key check.

Pure helpers with no setting of their own beyond the paths and the development key: config/settings.py and the
setting groups it imports (config/security.py, config/knobs.py) read every variable through them, and tests may
import them without configuring Django.
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PLATFORM_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def env_list(name: str, default: str) -> list[str]:
    """A comma-separated variable as a list, empty items dropped (`default` is the unset variable's text)."""
    return [item for item in os.environ.get(name, default).split(",") if item]


def env_debug() -> bool:
    """DJANGO_DEBUG, off unless set: settings.DEBUG, and the defaults that follow it (METRICS_PUBLIC)."""
    return env_bool("DJANGO_DEBUG", False)


INSECURE_DEFAULT_SECRET_KEY = "dev-only-insecure-key-change-me"


def secret_key_problem(key: str) -> str | None:
    """Why `key` is unfit to sign sessions and ingest tokens (Django's own check W009 criteria), or None."""
    if not key or key == INSECURE_DEFAULT_SECRET_KEY or key.startswith("django-insecure-"):
        return "it is unset or the built-in development default"
    if len(key) < 50 or len(set(key)) < 5:
        return "it is shorter than 50 characters or has fewer than 5 distinct characters"
    return None


def refuse_insecure_secret_key(key: str, debug: bool) -> None:
    """With DEBUG off, stop start-up (every process, `manage.py` included) when `key` is unfit."""
    problem = secret_key_problem(key)
    if not debug and problem:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY is insecure: {problem}. With DJANGO_DEBUG off, set it to a long "
            "random string, e.g. the output of `python -c 'import secrets; print(secrets.token_urlsafe(50))'` "
            "(`make run` generates one under var/)."
        )


def embedded_secret_key() -> str | None:
    """The key `make run` generated into VAR_DIR/secret-key (platform/up.py), or None when there is none: what
    `manage.py` uses when DJANGO_SECRET_KEY is unset, so its commands work in a checkout where `make run` ran."""
    try:
        return (VAR_DIR / "secret-key").read_text().strip() or None
    except OSError:
        return None


# Parts of a METRICS_TOKEN that mark a value copied from an example rather than generated.
PLACEHOLDER_MARKERS = ("change-me", "changeme", "placeholder", "example", "your-token")
METRICS_TOKEN_MIN_LENGTH = 32


def metrics_token_problem(token: str) -> str | None:
    """Why `token` is unfit to guard /metrics, or None (an empty token is none: staff sessions only)."""
    if not token:
        return None
    if any(marker in token.lower() for marker in PLACEHOLDER_MARKERS):
        return "it is a placeholder (such as platform/env.example's value)"
    if len(token) < METRICS_TOKEN_MIN_LENGTH or len(set(token)) < 5:
        return f"it is shorter than {METRICS_TOKEN_MIN_LENGTH} characters or has fewer than 5 distinct characters"
    return None


def refuse_placeholder_metrics_token(token: str) -> None:
    """Stop start-up (every process, DEBUG or not) when METRICS_TOKEN is set to a placeholder or a short value."""
    if problem := metrics_token_problem(token):
        raise ImproperlyConfigured(
            f"METRICS_TOKEN is unfit: {problem}. Set it to a long random string, e.g. the output of "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`, or unset it (then /metrics "
            "answers staff sessions only)."
        )


THROTTLE_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def env_throttle_rate(name: str) -> str | None:
    """A DRF throttle rate ("<requests>/<s|min|hour|day>") from the environment, or None when unset; a value
    DRF could not parse stops start-up here rather than failing every throttled request."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    count, _, period = value.partition("/")
    if not (count.isascii() and count.isdigit() and int(count) > 0 and period in THROTTLE_RATE_PERIODS):
        raise ImproperlyConfigured(f"{name}={value!r}: expected <requests>/<sec|min|hour|day>, e.g. 30/min")
    return value
