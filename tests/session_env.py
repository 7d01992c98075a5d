"""pytest plugin (loaded by pytest.ini's `-p`, before pytest-django reads the settings): the environment of a
test session. Django refuses the built-in SECRET_KEY with DEBUG off, so the session (and every server and
worker it starts, which inherit os.environ) gets a generated key; and a cache key prefix of its own, so sign-in
failure counters in a shared Redis never carry over from one session to the next."""

from __future__ import annotations

import os
import secrets

os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("CACHE_KEY_PREFIX", f"test-{secrets.token_hex(4)}")
