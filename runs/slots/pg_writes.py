"""The two writing statements of the PostgreSQL fast path (runs/slots/pg.py runs them): a release, and the grants
of a pass. Each writes a whole lifecycle move in one statement, the effects the move implies included (the
outbox's rows, runs/outbox/store.py, written only if the move is), so the move and its effects commit together
whether the statement runs in a caller's transaction or commits on its own. Their texts take the SET list of
the move's stamped columns and, for a release, the run's columns to return, by name.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from runs.messages import status_move_data_sql
from runs.models import Run
from runs.outbox.effects import RunEffect
from runs.outbox.store import effects_params, insert_cte

Columns = dict[str, Any]  # a move's stamped columns (runs.core.lifecycle.stamp)

# A release: one statement, no global lock. The run row lock (FOR UPDATE) and the allowed-from check serialize
# moves of one run; the slot row is deleted in the same statement, so the release commits as one small write.
# {returning} names the run's columns (`r.*` would change a prepared statement's result type under a migration).
_RELEASE_SQL = f"""WITH
cur AS (SELECT id, status FROM runs_run WHERE id = %(run)s FOR UPDATE),
upd AS (UPDATE runs_run r SET status = %(status)s, {{columns}}, error = %(error)s, last_seq = r.last_seq + 1
        FROM cur WHERE r.id = cur.id AND cur.status = ANY(%(allowed)s::text[])
        RETURNING {{returning}}, cur.status AS previous_status),
ev AS (INSERT INTO runs_runevent (run_id, seq, source, ts, type, data)
       SELECT id, last_seq, %(source)s, %(now)s, 'status',
              {status_move_data_sql(status="%(status)s::text", previous="previous_status", error="%(error)s::text")}
       FROM upd RETURNING 1),
rel AS (DELETE FROM runs_slot WHERE run_id IN (SELECT id FROM upd) RETURNING 1),
{insert_cte("EXISTS (SELECT 1 FROM upd)")}
SELECT upd.*, (SELECT count(*) FROM ev) AS events_added FROM upd"""

# The grants of a pass, all or none: every chosen slot still waiting and every chosen run in a state that may
# move to `starting` (rows locked), else nothing is written (their effects neither) and the counts say so. So
# a message may COMMIT right after it (a catch-up pass) without a look at the result first.
_APPLY_SQL = f"""WITH
cur AS (SELECT id, status FROM runs_run WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR UPDATE),
waiting AS (SELECT run_id FROM runs_slot WHERE run_id = ANY(%(ids)s::bigint[]) AND state = 'waiting' FOR UPDATE),
ok AS (SELECT (SELECT count(*) FROM cur WHERE status = ANY(%(allowed)s::text[])) = %(n)s
              AND (SELECT count(*) FROM waiting) = %(n)s AS yes),
s AS (UPDATE runs_slot x SET state = 'held', granted_at = %(now)s, placement = p.placement
      FROM unnest(%(ids)s::bigint[], %(placements)s::jsonb[]) AS p(run_id, placement), ok
      WHERE ok.yes AND x.state = 'waiting' AND x.run_id = p.run_id RETURNING x.run_id, x.requested_at),
r AS (UPDATE runs_run x SET status = %(status)s, {{columns}}, last_seq = x.last_seq + 1
      FROM cur, ok WHERE ok.yes AND x.id = cur.id
      RETURNING x.id, x.last_seq, x.owner_id, x.name, x.run_class, x.error, cur.status AS previous),
e AS (INSERT INTO runs_runevent (run_id, seq, source, ts, type, data)
      SELECT id, last_seq, %(source)s, %(now)s, 'status',
             {status_move_data_sql(status="%(status)s::text", previous="previous", error="error")}
      FROM r RETURNING 1),
{insert_cte("(SELECT yes FROM ok)")}
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM e), r.id, r.last_seq, r.owner_id, r.name, r.run_class, r.error,
       r.previous, s.requested_at
FROM (SELECT 1) AS one LEFT JOIN (r JOIN s ON s.run_id = r.id) ON true"""

_RUN_COLUMNS = frozenset(
    {"granted_at", "started_at", "finished_at", "heartbeat_at", "pending_reason", "pending_detail", "serving_url"}
)


def release_text(columns: Columns, effects: Sequence[RunEffect], params: dict[str, Any]) -> str:
    """The release statement for a move stamping `columns` and implying `effects` (their values go to `params`)."""
    params.update(effects_params(effects))
    return _RELEASE_SQL.format(columns=_set_columns(columns, params), returning=_returning())


def apply_text(columns: Columns, effects: Sequence[RunEffect], params: dict[str, Any]) -> str:
    """The grants statement for moves stamping `columns` and implying `effects` (their values go to `params`)."""
    params.update(effects_params(effects))
    return _APPLY_SQL.format(columns=_set_columns(columns, params))


def _set_columns(columns: Columns, params: dict[str, Any]) -> str:
    """The SET list for a move's stamped columns (names from runs.core.lifecycle.stamp, values as parameters)."""
    if not columns or not set(columns) <= _RUN_COLUMNS:
        raise ValueError(f"unexpected run columns {sorted(columns)}")
    for name, value in columns.items():
        params[f"col_{name}"] = value
    return ", ".join(f"{name} = %(col_{name})s" for name in sorted(columns))


@functools.cache
def _returning() -> str:
    return ", ".join(f'r."{f.column}"' for f in Run._meta.concrete_fields)
