"""Production settings: start-up refuses an insecure SECRET_KEY with DEBUG off, the HTTPS settings come from the
environment and `manage.py check --deploy` is clean for platform/env.example; password validators are on."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError

REPO = Path(__file__).resolve().parents[2]


def env_example() -> dict[str, str]:
    values = {}
    for line in (REPO / "platform" / "env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=base | env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_for_the_production_env_example():
    # The example's secrets are placeholders (refused at start): a deployment sets its own, as here.
    env = env_example() | {"DJANGO_SECRET_KEY": secrets.token_urlsafe(50), "METRICS_TOKEN": secrets.token_urlsafe(32)}
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    shown = manage(
        env,
        "shell",
        "-c",
        "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
        "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
        "s.SECURE_HSTS_PRELOAD, s.SECURE_PROXY_SSL_HEADER, s.DEBUG)",
    )
    assert shown.stdout.split("\n")[-2] == "True True True 31536000 True True ('HTTP_X_FORWARDED_PROTO', 'https') False"


@pytest.mark.parametrize(
    "key",
    [
        None,
        "",
        "dev-only-insecure-key-change-me",
        "change-me-to-a-long-random-string",
        "django-insecure-" + "x" * 60,
        "ab" * 40,
    ],
)
def test_start_up_refuses_an_insecure_secret_key_with_debug_off(key):
    env = {"DJANGO_DEBUG": "false"} | ({} if key is None else {"DJANGO_SECRET_KEY": key})
    result = manage(env, "check")
    assert result.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is insecure" in result.stderr


def test_debug_allows_the_development_key_and_a_real_key_starts():
    assert manage({"DJANGO_DEBUG": "true"}, "check").returncode == 0
    assert manage({"DJANGO_DEBUG": "false", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50)}, "check").returncode == 0


def test_password_validators_are_on():
    for weak in ("pw", "password123", "12345678901234", "alicealice"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password(secrets.token_urlsafe(12))  # what platform/up.py generates for the admin
