"""Act once per Idempotency-Key: a retried POST (a lost answer, a client restart, a proxy's retry) returns what
the first one did instead of doing it again.

A key is the client's, per user and per operation (`scope`), for KEY_TTL. The first request with it inserts the
key's row and acts in ONE transaction: the row commits exactly when the act does, and an act refused (400, 409,
429) leaves no row, so a retry of a refused request is judged again. A concurrent request with the same key
blocks on the row's unique index until the first commits (PostgreSQL; SQLite has one writer and serializes
them), then finds the row: the same body is answered with the run the first one acted on, a different body is a
409 naming the key. A row older than KEY_TTL no longer counts: the next use of its key acts again (the owner's
expired rows are deleted then, so the table holds about one day of keys).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from runs.errors import InvalidInput, InvalidTransition, RunNotFound
from runs.idempotency.models import IdempotencyKey
from runs.models import Run

HEADER = "Idempotency-Key"
KEY_TTL = timedelta(hours=24)
KEY_MAX = 200
_KEY = re.compile(rf"[!-~]{{1,{KEY_MAX}}}")  # visible ASCII, no spaces: what proxies pass through unchanged


class KeyReused(InvalidTransition):
    """The key was used for this operation with another body: 409, field `Idempotency-Key`."""

    code = "idempotency_key_reused"


def key_from(headers: Any) -> str | None:
    """The request's key (None without the header); InvalidInput naming the header when it is malformed."""
    key = headers.get(HEADER)
    if key is None:
        return None
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidInput(f"must be 1 to {KEY_MAX} visible ASCII characters, without spaces", field=HEADER)
    return key


def body_sha256(body: Any) -> str:
    """The digest two requests must share to be the same request: their bodies as canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def act_once(*, owner: Any, scope: str, key: str, body: Any, act: Callable[[], Run]) -> tuple[Run, bool]:
    """Run `act` (which returns the run it created or acted on) at most once per (owner, scope, key) within
    KEY_TTL. Returns (run, replayed): replayed is True when an earlier request with this key acted, and the run is
    then read fresh (its state now, not at that act)."""
    digest = body_sha256(body)
    for _ in range(3):
        replay = _recorded(owner=owner, scope=scope, key=key, digest=digest)
        if replay is not None:
            return replay, True
        claimed = False
        try:
            with transaction.atomic():
                now = timezone.now()
                IdempotencyKey.objects.filter(owner=owner, created_at__lt=now - KEY_TTL).delete()
                row = IdempotencyKey.objects.create(
                    owner=owner, scope=scope, key=key, body_sha256=digest, run_id=0, created_at=now
                )
                claimed = True
                run = act()
                IdempotencyKey.objects.filter(pk=row.pk).update(run_id=run.pk)
                return run, False
        except IntegrityError:
            if claimed:
                raise  # the act's own, not the key's
            continue  # a concurrent request with this key committed first (or aborted): look again
    raise InvalidTransition(f"{key!r} is in use by concurrent requests; retry", field=HEADER)


def _recorded(*, owner: Any, scope: str, key: str, digest: str) -> Run | None:
    row = (
        IdempotencyKey.objects.filter(owner=owner, scope=scope, key=key, created_at__gte=timezone.now() - KEY_TTL)
        .only("body_sha256", "run_id")
        .first()
    )
    if row is None:
        return None
    if row.body_sha256 != digest:
        raise KeyReused(
            f"{key!r} was used within {KEY_TTL.total_seconds() / 3600:.0f} hours for a request with another body",
            field=HEADER,
        )
    run = Run.objects.filter(pk=row.run_id).first()
    if run is None:
        raise RunNotFound(f"{key!r} acted on run {row.run_id}, which no longer exists", field=HEADER)
    return run
