"""The control plane's own knobs: realtime, stored events and samples, Ray runs and liveness, slots, metrics.

Django reads none of these; runs/ and frontend/ read them as django.conf.settings.<NAME> because
config/settings.py imports every one. Each keeps the environment variable of its name. Liveness and metrics are
described in docs/operations.md, the tick and Ray in docs/execution.md, slots in docs/slots.md.
"""

import os
from pathlib import Path

from config.env import VAR_DIR, env_bool, env_debug, env_int

# --- Realtime (docs/realtime.md) ------------------------------------------------------------------
# Websockets: a run consumer idle this long compares with the database (catches events published while
# Redis was unreachable); the dashboard sends at most one update per run per this interval.
REALTIME_RESYNC_SECONDS = float(os.environ.get("REALTIME_RESYNC_SECONDS", "2"))
REALTIME_COALESCE_SECONDS = float(os.environ.get("REALTIME_COALESCE_SECONDS", "0.1"))
# Websocket limits: open sockets per user across every ASGI process (counted in Redis; past it the socket is
# closed with 4429), events sent on connect before the client is pointed at the REST API for older ones, and how
# often an open socket re-reads its session (logout and staff changes also close sockets at once, by signal).
WS_MAX_PER_USER = env_int("WS_MAX_PER_USER", 20)
WS_REPLAY_MAX = env_int("WS_REPLAY_MAX", 2000)
WS_SESSION_RECHECK_SECONDS = float(os.environ.get("WS_SESSION_RECHECK_SECONDS", "15"))

# --- Stored events and samples --------------------------------------------------------------------
# Stored events per run (runs/telemetry/retention.py): high-rate types are thinned past half of it and not stored past
# it; `status` events are always stored. GET /api/runs/<id>/events/ pages are at most EVENTS_PAGE_MAX events.
EVENTS_MAX_PER_RUN = env_int("EVENTS_MAX_PER_RUN", 50_000)
EVENTS_DOWNSAMPLE_EVERY = env_int("EVENTS_DOWNSAMPLE_EVERY", 10)
EVENTS_PAGE_MAX = env_int("EVENTS_PAGE_MAX", 1000)
# Bytes of one posted event as compact JSON (runs/telemetry/ingest_validate.py; over it the batch is refused, 400 naming
# the event). A batch's cap is INGEST_MAX_BODY_BYTES (config/limits.py, 413).
INGEST_EVENT_MAX_BYTES = env_int("INGEST_EVENT_MAX_BYTES", 256 * 1024)
# Captured samples (runs/telemetry/samples.py): a run keeps its config's `samples_keep` newest samples, at most
# SAMPLES_MAX_PER_RUN; GET /api/runs/<id>/samples/ pages are at most SAMPLES_PAGE_MAX rows.
SAMPLES_MAX_PER_RUN = env_int("SAMPLES_MAX_PER_RUN", 200_000)
SAMPLES_PAGE_MAX = env_int("SAMPLES_PAGE_MAX", 200)

# --- The proxy to runs' session servers (runs/api/proxy.py, docs/api.md) --------------------------------------
# Seconds to connect to a run's session server, and to wait for its answer (or, streaming, for each next chunk).
AGENT_PROXY_CONNECT_TIMEOUT_SECONDS = float(os.environ.get("AGENT_PROXY_CONNECT_TIMEOUT_SECONDS", "5"))
AGENT_PROXY_READ_TIMEOUT_SECONDS = float(os.environ.get("AGENT_PROXY_READ_TIMEOUT_SECONDS", "120"))
# Bytes of a non-streamed answer relayed (a streamed one is relayed chunk by chunk up to this many bytes in all).
AGENT_PROXY_MAX_ANSWER_BYTES = env_int("AGENT_PROXY_MAX_ANSWER_BYTES", 8 * 1024 * 1024)
# Agent environments a run config may name besides the built-ins and installed entry points: exact `module:Class`
# paths, comma-separated (agents/environments.py; anything else is a 400 at submit and is never imported).
AGENT_ENVIRONMENTS_ALLOWED = tuple(
    p.strip() for p in os.environ.get("AGENT_ENVIRONMENTS_ALLOWED", "").split(",") if p.strip()
)

# --- Scheduler: the tick (runs.tasks.tick), queued by Celery beat every this many seconds ------------
SCHEDULER_TICK_SECONDS = float(os.environ.get("SCHEDULER_TICK_SECONDS", "2"))

# --- Ray ------------------------------------------------------------------------------------------
RAY_ADDRESS = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
PLATFORM_PUBLIC_URL = os.environ.get("PLATFORM_PUBLIC_URL", "http://127.0.0.1:8000")
RUN_ARTIFACTS_DIR = Path(os.environ.get("RUN_ARTIFACTS_DIR", VAR_DIR / "runs"))
# Ray submission ids are `<prefix>-<run id>-<attempt>`; give each installation sharing a cluster its own prefix.
RAY_SUBMISSION_PREFIX = os.environ.get("RAY_SUBMISSION_PREFIX", "rlrun")
# Seconds a stopped job gets after SIGTERM to checkpoint before Ray SIGKILLs it.
RUN_STOP_GRACE_SECONDS = env_int("RUN_STOP_GRACE_SECONDS", 60)
# A granted run not `running` this long after its grant fails "launch timeout ..." (Ray reachable only).
RUN_LAUNCH_TIMEOUT_SECONDS = env_int("RUN_LAUNCH_TIMEOUT_SECONDS", 900)
# A `starting` run whose job never posted anything by its placement_timeout_s plus this is put back in the queue.
RUN_PLACEMENT_MARGIN_SECONDS = env_int("RUN_PLACEMENT_MARGIN_SECONDS", 60)
# A node row dead and no longer listed by Ray this long is deleted (never while a held slot is placed on it).
CLUSTER_DEAD_NODE_RETENTION_SECONDS = env_int("CLUSTER_DEAD_NODE_RETENTION_SECONDS", 3600)
# Automatic resumes (Run.auto_resume) of one run, at most.
RUN_AUTO_RESUME_MAX = env_int("RUN_AUTO_RESUME_MAX", 3)

# --- Slots ----------------------------------------------------------------------------------------
SLOTS_DEFAULT_MAX_TOTAL = env_int("SLOTS_DEFAULT_MAX_TOTAL", 4)
# The interactive reserve when staff set none (unset: max(1, max_total // 4)); `make run` sets 0 on a machine
# that fits fewer than 4 runs, where a reserved slot would idle half of it for API runs.
SLOTS_DEFAULT_INTERACTIVE_RESERVE: int | None = (
    None
    if os.environ.get("SLOTS_DEFAULT_INTERACTIVE_RESERVE", "") == ""
    else env_int("SLOTS_DEFAULT_INTERACTIVE_RESERVE", 0)
)
SLOTS_HEARTBEAT_TIMEOUT_SECONDS = env_int("SLOTS_HEARTBEAT_TIMEOUT_SECONDS", 60)
# A running run whose heartbeat is stale while Ray still reports its job running is failed only after this long.
SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS = env_int("SLOTS_HEARTBEAT_HARD_TIMEOUT_SECONDS", 600)
SLOTS_POLICY_CACHE_SECONDS = float(os.environ.get("SLOTS_POLICY_CACHE_SECONDS", "1"))

# --- Prometheus metrics (docs/observability.md) ------------------------------------------------------
# GET /metrics answers staff sessions, and `Authorization: Bearer <METRICS_TOKEN>` when a token is set;
# METRICS_PUBLIC opens it to anyone (default: only with DJANGO_DEBUG). `manage.py metrics_serve` serves the
# same metrics without authentication on METRICS_ADDR:METRICS_PORT (a separate port for a private network).
METRICS_TOKEN = os.environ.get("METRICS_TOKEN", "")
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", env_debug())
METRICS_ADDR = os.environ.get("METRICS_ADDR", "127.0.0.1")
METRICS_PORT = env_int("METRICS_PORT", 9464)
# Redis hash prefix of the recorded counters and histograms (runs/metrics/record.py).
METRICS_REDIS_PREFIX = os.environ.get("METRICS_REDIS_PREFIX", "rlcp:metrics")
