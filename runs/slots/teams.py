"""Who is in which team for team quotas (runs/slots/quota.py): the groups with a quota that the snapshot's owners
belong to, read outside the pure grant and passed in as `Snapshot.groups` (the ORM loaders; the PostgreSQL
snapshot statement reads the same memberships itself, runs/slots/pg_snapshot.py). Nothing is read when no class
has quotas, so a snapshot without them is exactly what it was before."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from django.contrib.auth import get_user_model

from runs.slots.grant import Snapshot

CHUNK = 500  # owners per query (SQLite's bound on parameters)


def groups_load(names: Sequence[str], owners: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """Owner -> the groups among `names` it belongs to, sorted by name (owners in none are left out)."""
    ids = sorted({o for o in owners if o})
    if not names or not ids:
        return {}
    members = get_user_model().groups.through.objects
    found: dict[int, list[str]] = {}
    for chunk in (ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)):
        rows = members.filter(user_id__in=chunk, group__name__in=list(names)).values_list("user_id", "group__name")
        for owner, name in rows:
            found.setdefault(owner, []).append(name)
    return {owner: tuple(sorted(found[owner])) for owner in sorted(found)}


def with_groups(snapshot: Snapshot, *, extra_owners: Iterable[int] = ()) -> Snapshot:
    """The snapshot with the groups of its owners (held and waiting runs, and `extra_owners`) that have a quota;
    unchanged when no class has quotas."""
    names = snapshot.policy.quotas.names
    if not names:
        return snapshot
    owners = {h.owner for h in snapshot.running} | {w.owner for q in snapshot.waiting.values() for w in q}
    return dataclasses.replace(snapshot, groups=groups_load(names, owners | set(extra_owners)))
