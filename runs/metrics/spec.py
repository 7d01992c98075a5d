"""Every metric the platform exposes, declared once: name, type, help, labels and (histograms) buckets.

Names follow Prometheus conventions: the `rlcp_` prefix, base units in the name (`_seconds`, `_bytes`),
`_total` on counters. Recorded metrics (RECORDED) are written by the process where the thing happens into
Redis (runs/metrics/record.py); the others are read at scrape time (runs/telemetry/prometheus/collector.py).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "rlcp_"

# Seconds from sub-millisecond to days: admission waits, ingest latency, tick and publication times.
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 86400.0)
FAST_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STALENESS_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0)
# Requests per publication: 0 (a drain of nothing) apart from the rest, then doubling up to a big batch.
REQUEST_COUNT_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0)


@dataclass(frozen=True)
class Metric:
    name: str  # without PREFIX
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def full_name(self) -> str:
        return PREFIX + self.name


def _m(name: str, kind: str, help_: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = ()) -> Metric:
    return Metric(name, kind, help_, labels, buckets)


# --- recorded where they happen (Redis) ---------------------------------------------------------------
SLOT_GRANTS = _m("slot_grants_total", "counter", "Slots granted (runs moved to starting), by class.", ("run_class",))
ADMISSION_WAIT = _m(
    "admission_wait_seconds",
    "histogram",
    "Seconds from a slot request (submit or requeue) to its grant, by class.",
    ("run_class",),
    SECONDS_BUCKETS,
)
EVENTS_INGESTED = _m("events_ingested_total", "counter", "Run events stored by ingest, by event type.", ("type",))
EVENTS_DROPPED = _m("events_dropped_total", "counter", "Run events not stored by the per-run event budget.")
INGEST_DURATION = _m(
    "event_ingest_duration_seconds", "histogram", "Seconds to handle one ingest post.", (), FAST_SECONDS_BUCKETS
)
INGEST_LAG = _m(
    "event_ingest_lag_seconds",
    "histogram",
    "Seconds from an event's emission (its ts, the job's clock) to its storage.",
    (),
    SECONDS_BUCKETS,
)
TASK_FAILURES = _m("celery_task_failures_total", "counter", "Celery tasks that raised, by task name.", ("task",))
TICK_DURATION = _m("tick_duration_seconds", "histogram", "Seconds one scheduler tick took.", (), FAST_SECONDS_BUCKETS)
RECORDED: tuple[Metric, ...] = (
    SLOT_GRANTS,
    ADMISSION_WAIT,
    EVENTS_INGESTED,
    EVENTS_DROPPED,
    INGEST_DURATION,
    INGEST_LAG,
    TASK_FAILURES,
    TICK_DURATION,
)

# --- read at scrape time (database, Redis presence) -----------------------------------------------------
RUNS_PENDING = _m("runs_pending", "gauge", "Queued runs, by class and pending reason.", ("run_class", "reason"))
RUNS_ACTIVE = _m("runs_active", "gauge", "Runs holding a slot, by class and status.", ("run_class", "status"))
SLOTS_IN_USE = _m("slots_in_use", "gauge", "Held slots, by class.", ("run_class",))
SLOTS_LIMIT = _m("slots_limit", "gauge", "Effective slot limit of each class.", ("run_class",))
SLOTS_MAX_TOTAL = _m("slots_max", "gauge", "Slots all classes may hold together.")
RESOURCE_CAPACITY = _m(
    "cluster_resource_capacity",
    "gauge",
    "Alive nodes' total resources (cpu, gpu: units; memory: bytes).",
    ("resource",),
)
RESOURCE_USED = _m(
    "cluster_resource_used",
    "gauge",
    "Resources the held slots' bundles reserve (cpu, gpu: units; memory: bytes).",
    ("resource",),
)
RESOURCE_FREE = _m(
    "cluster_resource_free",
    "gauge",
    "Capacity minus what the held slots reserve (cpu, gpu: units; memory: bytes).",
    ("resource",),
)
WS_CONNECTIONS = _m("websocket_connections", "gauge", "Open dashboard and run websockets, all web processes.")
RUN_REWARD = _m("run_reward", "gauge", "Latest mean training reward of each running run.", ("run",))
RUN_EXACT_MATCH = _m("run_exact_match_ratio", "gauge", "Latest training exact-match of each running run.", ("run",))
RUN_STEP = _m("run_step", "gauge", "Training steps done by each running run.", ("run",))
RUN_PROGRESS = _m("run_progress_ratio", "gauge", "Steps done over steps total of each running run.", ("run",))
RUN_ETA = _m("run_eta_finish_seconds", "gauge", "Predicted seconds to each running run's finish.", ("run",))
RUN_VERSION = _m("run_weight_version", "gauge", "Weight version each running run last published.", ("run",))
RUN_GATE = _m("run_gate_state", "gauge", "1 for the gate state each running run last reported.", ("run", "state"))
RUN_STALENESS = _m(
    "run_staleness_steps",
    "histogram",
    "Per training step: the largest version gap between the trainer and a consumed token.",
    ("run",),
    STALENESS_BUCKETS,
)
RUN_PAUSE = _m(
    "run_publication_pause_seconds",
    "histogram",
    "Per weight publication: seconds generation was paused (seal to reopen).",
    ("run",),
    SECONDS_BUCKETS,
)
RUN_DRAIN = _m(
    "run_drain_seconds",
    "histogram",
    "Per weight publication: seconds the drain of in-flight requests took.",
    ("run",),
    SECONDS_BUCKETS,
)
RUN_DRAINED = _m(
    "run_publication_drained_leases",
    "histogram",
    "Per weight publication: requests in flight that the drains waited for, all engines (_sum: the total).",
    ("run",),
    REQUEST_COUNT_BUCKETS,
)
RUN_ADMITTED = _m(
    "run_publication_admitted_at_reopen",
    "histogram",
    "Per weight publication: requests that waited at the closed gates and were admitted at reopen, all engines.",
    ("run",),
    REQUEST_COUNT_BUCKETS,
)
RUN_HISTOGRAMS: tuple[Metric, ...] = (RUN_STALENESS, RUN_PAUSE, RUN_DRAIN, RUN_DRAINED, RUN_ADMITTED)

# Runs with an agent environment: the latest `agents` event (summary.agents; docs/agents.md, "Dashboard and
# metrics"). The counters are the job's own, cumulative since its attempt started (a resumed run restarts them).
RUN_AGENT_SESSIONS = _m(
    "run_agent_sessions", "gauge", "Live sessions bound to each engine by the run's session servers.", ("run", "engine")
)
RUN_AGENT_WAITING = _m(
    "run_agent_requests_waiting",
    "gauge",
    "Requests the run's session servers sent to an engine and have no answer for (a sealed gate's waiters too).",
    ("run",),
)
RUN_AGENT_REQUESTS = _m(
    "run_agent_requests_total", "counter", "Generation requests the run's session servers took.", ("run",)
)
RUN_AGENT_TOKENS = _m(
    "run_agent_tokens_total", "counter", "Completion tokens the run's session servers returned.", ("run",)
)
RUN_AGENT_ERRORS = _m(
    "run_agent_error_responses_total",
    "counter",
    "Error answers of the run's session servers, by HTTP status (400, 401, 404, 409, 410, 413, 503).",
    ("run", "status"),
)
RUN_AGENT_EPISODES = _m("run_agent_episodes_total", "counter", "Agent episodes the run's workers finished.", ("run",))
RUN_AGENT_TOOL_CALLS = _m(
    "run_agent_tool_calls_total", "counter", "Tool calls the run's agent episodes attempted.", ("run",)
)
RUN_AGENT_VALID_TOOL_CALLS = _m(
    "run_agent_valid_tool_calls_total", "counter", "Tool calls in the environment's documented format.", ("run",)
)
RUN_AGENT_TOOL_ERRORS = _m(
    "run_agent_tool_errors_total", "counter", "Tool calls whose tool failed or was refused.", ("run",)
)
RUN_AGENT_REWARD_PART = _m(
    "run_agent_reward_part",
    "gauge",
    "Mean of each reward part of the environment over the last step's trained episodes.",
    ("run", "part"),
)
# Counters of the agents event's data, by its field.
RUN_AGENT_COUNTERS: dict[str, Metric] = {
    "requests": RUN_AGENT_REQUESTS,
    "tokens": RUN_AGENT_TOKENS,
    "episodes": RUN_AGENT_EPISODES,
    "tool_calls": RUN_AGENT_TOOL_CALLS,
    "valid_tool_calls": RUN_AGENT_VALID_TOOL_CALLS,
    "tool_errors": RUN_AGENT_TOOL_ERRORS,
}

# Every running run's engines, from the latest `gate` event (summary.gate.engines): cumulative since each engine
# started (a restarted engine counts from 0 again). rate(rows) / rate(steps) is how many rows a forward step
# carried lately: how well the engine batches (docs/trainer.md, "Snapshot").
RUN_ENGINE_STEPS = _m(
    "run_engine_forward_steps_total", "counter", "Forward steps each engine of the run ran.", ("run", "engine")
)
RUN_ENGINE_ROWS = _m(
    "run_engine_rows_stepped_total",
    "counter",
    "Rows those forward steps advanced (rows / steps: the engine's batching).",
    ("run", "engine"),
)
# Counters of a gate event's engine entries, by their field.
RUN_ENGINE_COUNTERS: dict[str, Metric] = {"steps": RUN_ENGINE_STEPS, "rows_stepped": RUN_ENGINE_ROWS}
