"""The run's serving key: the secret the platform's proxy presents to the run's session server
(`Authorization: Bearer <key>` on every request it forwards; docs/api.md, "Talking to a run's policy").

The platform derives a key per run attempt at launch and hands it over like the ingest token: in a 0600 file
whose path is in $RLCP_SERVING_KEY_FILE (the Ray job API shows every job's env to anyone who can list jobs, so
the key itself is never in it). A job started by hand (no platform) may set $RLCP_SERVING_KEY instead.
"""

from __future__ import annotations

import os
from pathlib import Path

SERVING_KEY_ENV = "RLCP_SERVING_KEY"
SERVING_KEY_FILE_ENV = "RLCP_SERVING_KEY_FILE"


def serving_key_from_env() -> str:
    """The serving key: read from $RLCP_SERVING_KEY_FILE if set, else $RLCP_SERVING_KEY, else '' (no key: the
    session server must then refuse every request from outside the job)."""
    path = os.environ.get(SERVING_KEY_FILE_ENV)
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(SERVING_KEY_ENV, "")
