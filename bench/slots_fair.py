"""The fair-share phase of bench/slots.py: the cost of one release -> grant cycle (the release, then the grant
pass: lock, snapshot, usage, grant, commit) with fair share off and on, at the same queue depth, in alternating
rounds (off, on, off, on, ...; each round's median), so drift of the shared machine hits both alike. The queue is
spread over many owners, a finished-run history gives them usage, and fair share is turned on for every class
(the snapshot then loads each owner's FIFO prefix of every class). The queue is emptied afterwards and the
settings reset, so the phases after it see what they always saw.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def spread_owners(owner_ids: list[int]) -> None:
    """Give the waiting runs (and a history of finished runs, for usage) owners round-robin."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs_run SET owner_id = (%s::int[])[1 + id %% %s] WHERE status IN ('queued', 'succeeded')",
            [owner_ids, len(owner_ids)],
        )
        cur.execute("UPDATE runs_slot s SET owner_id = r.owner_id FROM runs_run r WHERE r.id = s.run_id")
        cur.execute(  # the history: each finished run ran 10 minutes, ending within the last two hours
            "UPDATE runs_run SET granted_at = now() - (id %% 7200) * interval '1 second' - interval '10 minutes', "
            "finished_at = now() - (id %% 7200) * interval '1 second' WHERE status = 'succeeded'",
            [],
        )
        cur.execute("ANALYZE runs_run; ANALYZE runs_slot")


def fair_settings(on: bool) -> None:
    from runs.scheduling.concurrency import settings_update

    classes = {k: {"fair_share": True if on else None} for k in ("interactive", "app", "schedule", "system")}
    settings_update(changes={"classes": classes}, partial=True, by=None)


def timed_cycles(cycles: int) -> float:
    from slots_procs import finish_one

    for _ in range(5):  # warm up the statements of this setting
        finish_one()
    times = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        finish_one()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure_fair(
    owner_id: int, fill_queue: Callable, set_policy: Callable, waiting: int, owners: int, rounds: int, cycles: int
) -> dict:
    """Per-grant cost off and on (medians of alternating rounds, their spread, the ratio on / off).
    `fill_queue`, `set_policy`: bench/slots.py's."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from runs.core.lifecycle import slots_grant

    users = [get_user_model().objects.create_user(f"fair-{i}").pk for i in range(owners)]
    classes = ("interactive", "app", "schedule", "system")
    set_policy(4)
    used = rounds * 2 * (cycles + 5)
    fill_queue(owner_id=owner_id, count=waiting + used, classes=classes)
    history(owner_id, waiting)  # as many finished runs as waiting ones
    spread_owners(users)
    slots_grant(reason="bench")
    medians: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            fair_settings(mode == "on")
            medians[mode].append(round(timed_cycles(cycles), 3))
    from runs.slots.store import capacity_load, policy_load
    from runs.slots.usage import usage_load

    usage = usage_load(policy_load(fresh=True).fairness, capacity_load())  # on: the last round's setting
    fair_settings(False)
    with connection.cursor() as cur:  # leave an empty queue to the phases after this one
        cur.execute(
            "UPDATE runs_run SET status = 'cancelled' WHERE id IN (SELECT run_id FROM runs_slot "
            "WHERE state = 'waiting')"
        )
        cur.execute("DELETE FROM runs_slot WHERE state = 'waiting'")
    off, on = statistics.median(medians["off"]), statistics.median(medians["on"])
    result = {
        "waiting": waiting,
        "owners": owners,
        "rounds": rounds,
        "cycles_per_round": cycles,
        "off_ms_per_grant": round(off, 3),
        "on_ms_per_grant": round(on, 3),
        "ratio": round(on / off, 3) if off else 0.0,
        "owners_with_usage": len(usage),  # fair share had something to order by
        "round_medians_ms": medians,
        "spread_ms": {k: [min(v), max(v)] for k, v in medians.items()},
    }
    print(f"fair share: {result}", flush=True)
    return result


def history(owner_id: int, count: int) -> None:
    """`count` finished runs, copied from a queued run's row: what usage is computed from."""
    from django.db import connection

    from runs.models import Run

    template = Run.objects.filter(owner_id=owner_id).order_by("id").first()
    assert template is not None
    cols = [f.column for f in Run._meta.concrete_fields if f.column not in ("id", "status")]
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO runs_run ({', '.join(cols)}, status) SELECT {', '.join(cols)}, 'succeeded' "
            "FROM runs_run, generate_series(1, %s) g WHERE runs_run.id = %s",
            [count, template.pk],
        )
