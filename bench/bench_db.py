"""What the database benches share (events, samples, webhooks): a bench database of their own, created and
migrated, and the percentile they report. Not a bench: imported by them (`python bench/<name>.py` puts bench/
first on the path)."""

from __future__ import annotations

import os
import uuid
from typing import Any


def database_prepare(url: str) -> None:
    """Create the bench database if missing and migrate it (its own name: never a test or dev database)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def django_for_bench(default_db: str, prefix: str) -> Any:
    """A Redis server of the bench's own, this process's environment pointed at it and at the bench database
    (BENCH_DATABASE_URL, else `default_db`), a channel-layer prefix of its own, Django set up and the database
    migrated. Returns the started RedisServer (the caller stops it)."""
    from tests.realtime.servers import RedisServer

    redis = RedisServer().start()
    db_url = os.environ.get("BENCH_DATABASE_URL", default_db)
    os.environ.update(
        {
            "DATABASE_URL": db_url,
            "REDIS_URL": redis.url,
            "CHANNEL_LAYER_PREFIX": f"{prefix}{uuid.uuid4().hex[:6]}",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    import django

    django.setup()
    database_prepare(db_url)
    return redis


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0..1) of `values`; NaN for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")
