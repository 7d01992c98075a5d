"""What the embedded run command (platform/up.py) shows on its terminal: quiet by default, everything with
--verbose.

Quiet: the children's routine chatter is silenced at its source where it can be (Celery's per-task and
start-up loggers and daphne's at WARNING through LOG_LEVEL_CHATTER, Celery's banners by `--quiet`, the web
access log to var/logs/web-access.log), and what cannot be (Redis's and Ray's start-up output) goes to
var/logs/<name>.log only: Ray's warnings and errors still reach the terminal, and the hidden tail of a child
that exits is printed. The banner (URL, login, a curl to try) is printed once the platform answers and the
terminal has settled, and again if start-up output scrolled it away soon after.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from supervise import Supervisor

SETTLE_SECONDS = 2.0  # the terminal counts as settled after this long without a new line
SETTLE_MAX_SECONDS = 20.0  # print the banner after this long even if the terminal never settles (--verbose)
REPRINT_WINDOW_SECONDS = 60.0  # start-up output this soon after the banner gets the banner printed again
LEVELS = {"DEBUG": 10, "INFO": 20, "SUCC": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50, "FATAL": 50}
# Ray's log lines: "2026-11-30 10:19:45,341\tINFO scripts.py:1088 -- ..."
RAY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?P<level>[A-Z]+) ")


class LevelFilter:
    """Shows log lines at `minimum` or above; a line without a level (a traceback, a continuation) goes with the
    line before it."""

    def __init__(self, pattern: re.Pattern[str], minimum: str = "WARNING") -> None:
        self.pattern = pattern
        self.minimum = LEVELS[minimum]
        self.showing = False

    def __call__(self, line: str) -> bool:
        match = self.pattern.match(line)
        if match:
            self.showing = LEVELS.get(match.group("level"), LEVELS["WARNING"]) >= self.minimum
        return self.showing


def hide(line: str) -> bool:
    return False


def shown_lines(name: str, verbose: bool) -> Callable[[str], bool] | None:
    """The terminal filter of one child (None: every line)."""
    if verbose:
        return None
    if name == "redis":
        return hide  # its start-up notices; when it fails it exits, and up.py prints its last lines
    if name == "ray":
        return LevelFilter(RAY_LINE)
    return None  # web, worker, tick: quiet at the source


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:  # 401/403 from an authenticated endpoint still means "serving"
        return exc.code < 500


def redacted(url: str) -> str:
    """The URL with any password replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def banner(env: dict[str, str], login: dict[str, str], state: str) -> str:
    url = env["PLATFORM_PUBLIC_URL"]
    var = Path(env["PLATFORM_VAR_DIR"])
    return f"""
================================================================================
 The platform {state}: {url}/
   login     {login["username"]} / {login["password"]}      (admin: {url}/admin/)
   API token {login["token"]}
   Ray       {env["RAY_ADDRESS"]}   Redis {redacted(env["REDIS_URL"])}
   database  {env.get("DATABASE_URL") or var / "db.sqlite3"}
   logs      {var / "logs"}/   (all output here too: make run ARGS=--verbose)
   slots     {env.get("PLATFORM_SLOTS_LINE", "")}
 Submit a small training run:
   curl -s -X POST {url}/api/runs/ -H "Authorization: Token {login["token"]}" \\
     -H 'Content-Type: application/json' \\
     -d '{{"name": "first", "origin": "api", "kind": "rl_train", "config": {{"steps": 20}}}}'
 Watch it: {url}/  (or: curl -s -H "Authorization: Token {login["token"]}" {url}/api/runs/)
 Ctrl-C stops everything.
================================================================================
"""


def settled(supervisor: Supervisor, until: float) -> None:
    """Wait until the terminal has had no new line for SETTLE_SECONDS, or until `until` (monotonic)."""
    while time.monotonic() - supervisor.last_shown < SETTLE_SECONDS and time.monotonic() < until:
        time.sleep(0.2)


def banner_when_ready(
    supervisor: Supervisor, env: dict[str, str], login: dict[str, str], verbose: bool, stopping: threading.Event
) -> None:
    """The banner once the platform answers, and again after start-up output scrolled it away; never once the
    stop began (the stop's own lines would bring it back, as if the platform were up again)."""
    url = env["PLATFORM_PUBLIC_URL"]
    ready = wait_until(
        lambda: stopping.is_set() or http_ok(f"{url}/admin/login/") and http_ok(f"{env['RAY_ADDRESS']}/api/version"),
        180,
    )
    text = banner(env, login, "is up" if ready else "is still starting (see the log lines above)")

    def show_when_settled() -> bool:
        settled(supervisor, time.monotonic() + SETTLE_MAX_SECONDS)
        if stopping.is_set():
            return False
        supervisor.announce(text)
        return True

    if not show_when_settled() or verbose:
        return  # --verbose: every tick is shown, the terminal never settles, and --verbose asked for that
    # Start-up output that comes soon after (a late service, a warning) scrolls the banner away: print it again
    # once the terminal has settled.
    shown_at, window_end = supervisor.last_shown, time.monotonic() + REPRINT_WINDOW_SECONDS
    while time.monotonic() < window_end:
        time.sleep(0.5)
        if supervisor.last_shown > shown_at:
            if not show_when_settled():
                return
            shown_at = supervisor.last_shown
