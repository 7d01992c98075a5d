"""The secrets of a run's attempt, derived and never stored: the ingest token its job posts events with and the
serving key its session server takes (HMAC-SHA256 keyed by SECRET_KEY over run, attempt and a stored nonce).
runs.models stores the nonce; reading the database, or a backup, yields neither secret."""

from __future__ import annotations

import secrets

from django.utils.crypto import salted_hmac


def new_ingest_nonce() -> str:
    return secrets.token_hex(16)


def ingest_token_derive(*, run_id: int, attempt: int, nonce: str, secret: str | None = None) -> str:
    """The ingest token of one attempt of a run: HMAC-SHA256 keyed by SECRET_KEY over (run, attempt, nonce).
    Never stored: the database holds only the nonce, so reading it (or a backup) yields no token; a new attempt
    gives a new token, and a relaunch of the same attempt the same one (docs/execution.md)."""
    return salted_hmac(
        "runs.ingest_token", f"{run_id}:{attempt}:{nonce}", secret=secret, algorithm="sha256"
    ).hexdigest()


def serving_key_derive(*, run_id: int, attempt: int, nonce: str, secret: str | None = None) -> str:
    """The serving key of one attempt of a run (the secret the proxy shows the run's session server:
    trainer/serving_key.py): the ingest token's derivation under its own salt, so neither yields the other and
    nothing secret is stored."""
    return salted_hmac("runs.serving_key", f"{run_id}:{attempt}:{nonce}", secret=secret, algorithm="sha256").hexdigest()
