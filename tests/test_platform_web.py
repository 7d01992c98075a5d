"""The web process's flags (platform/web.py, used by the Procfile and by `make run`): daphne trusts
X-Forwarded-For (--proxy-headers) only when a trusted proxy count is set; and platform/env.example shows Redis
with authentication."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "platform"))
from web import daphne_argv  # noqa: E402  (a script directory, not a package)

sys.path.remove(str(REPO / "platform"))


@pytest.mark.parametrize("proxies,trusted", [(None, False), ("", False), ("0", False), ("1", True), ("2", True)])
def test_proxy_headers_only_with_a_trusted_proxy_count(proxies, trusted):
    env = {} if proxies is None else {"DJANGO_NUM_PROXIES": proxies}
    argv = daphne_argv(env, daphne="daphne", bind="127.0.0.1", port="8123")
    assert ("--proxy-headers" in argv) is trusted
    assert argv[:5] == ["daphne", "-b", "127.0.0.1", "-p", "8123"] and argv[-1] == "config.asgi:application"


def test_a_bad_proxy_count_stops_the_web_process_with_a_message():
    result = subprocess.run(
        [sys.executable, str(REPO / "platform" / "web.py")],
        env={"DJANGO_NUM_PROXIES": "yes", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "DJANGO_NUM_PROXIES='yes'" in result.stderr


def test_the_procfile_web_process_goes_through_web_py():
    procfile = (REPO / "platform" / "Procfile").read_text()
    (web,) = [line for line in procfile.splitlines() if line.startswith("web:")]
    assert "platform/web.py" in web and "--proxy-headers" not in web


def test_env_example_redis_url_carries_a_password():
    example = (REPO / "platform" / "env.example").read_text()
    (line,) = [line for line in example.splitlines() if line.startswith("REDIS_URL=")]
    assert urlsplit(line.split("=", 1)[1]).password
    assert "requirepass" in example
