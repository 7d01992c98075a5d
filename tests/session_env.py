"""pytest plugin (loaded by pytest.ini's `-p`, before pytest-django reads the settings): the environment of a
test session. Django refuses the built-in SECRET_KEY with DEBUG off, so the session (and every server and
worker it starts, which inherit os.environ) gets a generated key; and a cache key prefix of its own, so sign-in
failure counters in a shared Redis never carry over from one session to the next.

On SQLite (DATABASE_URL sqlite, or unset: the embedded default) the test database is a file of this session's
own, not Django's in-memory default: the platform's threads (the dashboard publisher, threaded crowd tests) share
an in-memory database through SQLite's shared cache, whose table locks fail a test at random ("database table is
locked"), where a file in WAL mode makes them wait like the platform's own processes do. SQLITE_TEST_NAME, when
set, names the file instead."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("CACHE_KEY_PREFIX", f"test-{secrets.token_hex(4)}")
if os.environ.get("DATABASE_URL", "sqlite:").startswith("sqlite:"):
    # pytest-django creates it at the start and removes it at the end; the pid keeps parallel sessions apart.
    os.environ.setdefault("SQLITE_TEST_NAME", str(Path(tempfile.gettempdir()) / f"rlcp-test-{os.getpid()}.sqlite3"))
