"""What every process checks at start, run as real processes (`manage.py`, the settings imported in a fresh
interpreter): a placeholder or short METRICS_TOKEN is refused with a clear message; `testserver` is not an
allowed host outside tests; throttle rates from the environment are checked; and `manage.py` works in a
checkout where `make run` ran, with its generated var/secret-key and embedded SQLite database (issue 22,
point 8): `createsuperuser --noinput` makes a user in that database, and `shell` reads it."""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_throttle_rate, metrics_token_problem

REPO = Path(__file__).resolve().parent.parent
# Settings a developer's or CI's environment may carry; the embedded platform sets none of them.
NOT_EMBEDDED = (
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "METRICS_TOKEN",
)


def bare_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_EMBEDDED and not k.startswith("THROTTLE_RATE_")}
    return {**env, "PLATFORM_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "config.settings", **extra}


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def env_example_value(name: str) -> str:
    text = (REPO / "platform" / "env.example").read_text()
    match = re.search(rf"^{name}=(.*)$", text, re.MULTILINE)
    assert match, f"{name} is not in platform/env.example"
    return match.group(1).strip()


def test_metrics_token_placeholders_and_short_values_are_unfit():
    for bad in (env_example_value("METRICS_TOKEN"), "change-me", "CHANGEME-" + "x" * 40, "short", "a" * 40):
        assert metrics_token_problem(bad), bad
    for good in ("", secrets.token_urlsafe(32)):
        assert metrics_token_problem(good) is None


@pytest.mark.parametrize("debug", ["0", "1"])
def test_a_placeholder_metrics_token_stops_start_up_with_a_clear_message(tmp_path, debug):
    env = bare_env(tmp_path, DJANGO_SECRET_KEY=secrets.token_urlsafe(50), DJANGO_DEBUG=debug, METRICS_TOKEN="change-me")
    refused = manage(env, "check")
    assert refused.returncode != 0
    assert "METRICS_TOKEN is unfit: it is a placeholder" in refused.stderr, refused.stderr[-2000:]
    served = manage({**env, "METRICS_TOKEN": secrets.token_urlsafe(32)}, "check")
    assert served.returncode == 0, served.stderr[-2000:]


def test_throttle_rates_from_the_environment_are_checked(monkeypatch):
    monkeypatch.setenv("THROTTLE_RATE_TRACE", "5/min")
    assert env_throttle_rate("THROTTLE_RATE_TRACE") == "5/min"
    monkeypatch.delenv("THROTTLE_RATE_TRACE")
    assert env_throttle_rate("THROTTLE_RATE_TRACE") is None
    for bad in ("5", "five/min", "0/min", "5/fortnight", "-1/s"):
        monkeypatch.setenv("THROTTLE_RATE_TRACE", bad)
        with pytest.raises(ImproperlyConfigured, match="THROTTLE_RATE_TRACE"):
            env_throttle_rate("THROTTLE_RATE_TRACE")


def test_manage_py_works_on_the_embedded_platform(tmp_path):
    env = bare_env(tmp_path)
    # Before `make run` generated a key, manage.py refuses as it always did.
    refused = manage(env, "check")
    assert refused.returncode != 0 and "DJANGO_SECRET_KEY is insecure" in refused.stderr, refused.stderr[-2000:]

    # What `make run` leaves behind: var/secret-key (made by the same helper, 0600) and the migrated database.
    sys.path.insert(0, str(REPO / "platform"))
    try:
        from embedded import secret
    finally:
        sys.path.remove(str(REPO / "platform"))
    secret(tmp_path / "secret-key", lambda: secrets.token_urlsafe(50))
    migrated = manage(env, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    assert (tmp_path / "db.sqlite3").exists()

    password = secrets.token_urlsafe(16)
    created = manage(
        {**env, "DJANGO_SUPERUSER_PASSWORD": password},
        "createsuperuser",
        "--noinput",
        "--username",
        "ops",
        "--email",
        "ops@example.com",
    )
    assert created.returncode == 0, created.stderr[-2000:]
    with sqlite3.connect(tmp_path / "db.sqlite3") as db:
        rows = db.execute("SELECT is_superuser, is_staff FROM auth_user WHERE username = 'ops'").fetchall()
    assert rows == [(1, 1)]

    shell = manage(
        {**env, "PW": password},
        "shell",
        "-c",
        "import os; from django.conf import settings; from django.contrib.auth import get_user_model; "
        "u = get_user_model().objects.get(username='ops'); "
        "print(u.check_password(os.environ['PW']), 'testserver' in settings.ALLOWED_HOSTS)",
    )
    assert shell.returncode == 0, shell.stderr[-2000:]
    # The password works, and outside tests `testserver` is not an allowed host.
    assert shell.stdout.strip().splitlines()[-1] == "True False"
