"""What the database benches share (events, samples, webhooks): a bench database of their own, created and
migrated, and the percentile they report. Not a bench: imported by them (`python bench/<name>.py` puts bench/
first on the path)."""

from __future__ import annotations


def database_prepare(url: str) -> None:
    """Create the bench database if missing and migrate it (its own name: never a test or dev database)."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile `q` (0..1) of `values`; NaN for none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")
