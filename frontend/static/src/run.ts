/** Run page: live charts, gate/version timeline, engines and workers, checkpoints, event log, config, and
 * cancel/resume (run_actions.ts). Live over /ws/runs/<id>/: first connect asks ?after=0 (whole history), every
 * reconnect asks ?after=<last seq seen> and gets exactly the missed events (docs/realtime.md). Events and the run
 * are the generated types of lib/messages.ts: each `case` of `ingest` reads its event type's data model. */
import { api, embedded } from "./lib/api";
import { CLASS_LABEL, detailText, esc, num, reasonText, timeOfDay } from "./lib/format";
import { LiveSocket, wsUrl } from "./lib/live";
import type { CheckpointData, EventsMsg, GateEngine, RunJson, RunSnapshotMsg, StoredEvent, TruncatedMsg, WorkerData } from "./lib/messages";
import { ACTIVE, FINISHED, runView } from "./lib/model";
import { runActions } from "./run_actions";
import { AgentsPanel } from "./run_agents";
import { RunCharts } from "./run_charts";
import { RunHeatmap } from "./run_heatmap";
import { EventLog } from "./run_log";
import { ChatPanel } from "./run_chat";
import { GateReset } from "./run_gate_reset";
import { ServingPanel } from "./run_serving";
import { Timeline } from "./run_timeline";

let run = embedded<RunJson>("run-data")!;
let lastSeq = 0;
let statusSeq = 0; // seq of the newest status event (a platform move) applied
const cfg = run.config; // free-form (each run kind's keys): every read checks its type
const perStep = typeof cfg.prompts_per_step === "number" && typeof cfg.group_size === "number" ? cfg.prompts_per_step * cfg.group_size : null;
const charts = new RunCharts(document.getElementById("charts")!, perStep, (step) => location.assign(`/runs/${run.id}/samples/?step=${step}`));
const timeline = new Timeline(document.getElementById("timeline")!);
const heatmap = new RunHeatmap(document.getElementById("heatmap")!);
const log = new EventLog(document.getElementById("log")!);
const serving = new ServingPanel();
const agents = new AgentsPanel();
const agentsCard = document.getElementById("agents-card");
if (agentsCard && typeof cfg.environment === "string") agentsCard.hidden = false; // an agent run: shown from the start
/** An engine as the engines table shows it: its latest gate report, alive or retired (worker events). */
interface EngineRow extends GateEngine { engine: string; status: "alive" | "retired"; tombstoned_sessions?: number | null }
const engines = new Map<string, EngineRow>();
let topology: WorkerData | null = null; // the job's "started" event: workers, mode, resources
const lifecycle: { ts: number; data: WorkerData }[] = []; // worker events: started, engine_lost, engine_restarted, ...
const checkpoints: { seq: number; ts: number; data: CheckpointData }[] = [];
const resumeButton = document.getElementById("btn-resume") as HTMLButtonElement;
const restartButton = document.getElementById("btn-restart") as HTMLButtonElement;
// The step a resume continues from (the server's answer at page load, then each usable checkpoint event):
// null when the run has none, so only "Start over from step 0" is offered (runs/core/checkpoints.py, same rule).
let checkpointStep: number | null = resumeButton.dataset.checkpointStep ? Number(resumeButton.dataset.checkpointStep) : null;

/** The step of a checkpoint event a resume can use (written or restored; a failed one is not), else null. */
function usableCheckpoint(d: CheckpointData): number | null {
  if (typeof d.step !== "number" || !Number.isInteger(d.step) || d.step < 0) return null;
  return d.reason === "restored" || (d.state ?? "saved") === "saved" ? d.step : null;
}
let panelsDirty = true;
let headerDirty = true;
let frame = 0;

function ingest(ev: StoredEvent): void {
  if (ev.seq <= lastSeq) return; // never apply an event twice (the server already guarantees it; cheap to check)
  lastSeq = ev.seq;
  const summary = run.summary;
  switch (ev.type) {
    case "status": // the platform's moves; the job's own reports (`job_status`) are only logged
      statusSeq = ev.seq;
      run = { ...run, status: ev.data.status, error: ev.data.error };
      if (FINISHED.has(run.status)) timeline.end = ev.ts;
      break;
    case "gate":
      summary.gate = ev.data;
      ev.data.engines.forEach((e, i) => {
        const key = e.engine ?? String(i);
        engines.set(key, { ...e, engine: key, status: engines.get(key)?.status ?? "alive" });
      });
      break;
    case "version": summary.version = ev.data; break;
    case "sampler": summary.sampler = ev.data; break;
    case "train": summary.train = ev.data; break;
    case "worker": {
      const d = ev.data;
      lifecycle.push({ ts: ev.ts, data: d });
      if (d.event === "started") topology = d;
      const known = d.engine != null ? engines.get(d.engine) ?? { engine: d.engine } : null;
      if (d.event === "engine_lost" && known) {
        engines.set(known.engine, { ...known, status: "retired", tombstoned_sessions: d.tombstoned_sessions });
      }
      if (d.event === "engine_restarted" && known) engines.set(known.engine, { ...known, status: "alive", version: d.version });
      break;
    }
    case "preempt_requested": run = { ...run, preempt_state: "requested", preempted_by: ev.data.by, preempt_reason: ev.data.reason }; break;
    case "preempted": run = { ...run, preempt_state: "preempted" }; break;
    case "resumed": run = { ...run, preempt_state: "resumed" }; break;
    case "checkpoint":
      checkpoints.push({ seq: ev.seq, ts: ev.ts, data: ev.data });
      summary.checkpoint = ev.data;
      checkpointStep = usableCheckpoint(ev.data) ?? checkpointStep;
      break;
  }
  serving.add(ev);
  agents.add(ev);
  charts.add(ev);
  heatmap.add(ev);
  timeline.add(ev);
  log.add(ev);
  panelsDirty = headerDirty = true;
}

function renderHeader(): void {
  const badge = document.getElementById("run-status")!;
  badge.className = `badge st-${run.status}`;
  badge.textContent = run.status;
  document.getElementById("btn-cancel")!.hidden = !(run.status === "queued" || ACTIVE.has(run.status)) || run.status === "stopping";
  const resumable = run.status === "failed" || run.status === "cancelled";
  resumeButton.hidden = !resumable || checkpointStep === null;
  resumeButton.textContent = `Resume from checkpoint step ${checkpointStep ?? "—"}`;
  restartButton.hidden = !resumable;
  gateReset.update();
  chat.update();
  const err = document.getElementById("run-error")!;
  err.hidden = !run.error;
  err.textContent = run.error ? `Error: ${run.error}` : "";
  const v = runView(run.summary);
  const pct = v.datasetSize ? Math.min(100, ((v.consumed ?? 0) / v.datasetSize) * 100) : 0;
  const stat = (label: string, value: string, testid = "") => `<div class="stat"><div class="l">${label}</div><div class="v num"${testid ? ` data-testid="${testid}"` : ""}>${value}</div></div>`;
  const queueInfo = run.status === "queued" && run.position ? stat("Queue position", esc(run.position.overall)) : "";
  const detail = run.pending_detail ? ` · ${detailText(run.pending_detail)}` : "";
  const waiting = run.status === "queued" && run.pending_reason ? `<div class="stat"><div class="l">Waiting</div><div class="v" data-testid="pending-reason">${esc(reasonText(run.pending_reason) + detail)}</div></div>` : "";
  document.getElementById("stats")!.innerHTML = [
    queueInfo,
    waiting,
    run.preempt_state ? `<div class="stat" title="${esc(run.preempt_reason)}"><div class="l">Preemption</div><div class="v" data-testid="preempt">${esc(run.preempt_state)}${run.preempted_by !== null ? ` · for <a href="/runs/${esc(run.preempted_by)}/">#${esc(run.preempted_by)}</a>` : ""}</div></div>` : "",
    stat("Weights", v.version === null ? "—" : `v${esc(v.version)}`, "version"),
    `<div class="stat"><div class="l">Gate</div><div class="v">${v.gateState ? `<span class="badge gate-${esc(v.gateState)}" data-testid="gate">${esc(v.gateState)}</span>` : "—"}</div></div>`,
    `<div class="stat"><div class="l">Sampler</div><div class="v num" data-testid="sampler">${v.datasetSize ? `${esc(v.consumed ?? 0)} / ${esc(v.datasetSize)}` : "—"}</div>
      <div class="progress" role="progressbar" aria-label="Sampler progress in epoch" aria-valuemin="0" aria-valuemax="${esc(v.datasetSize ?? 0)}" aria-valuenow="${esc(v.consumed ?? 0)}"><div class="bar"><span style="width:${pct.toFixed(1)}%"></span></div>
      <div class="lbl">epoch ${esc(v.epoch ?? 0)}${v.groupCount !== null ? ` · ${esc(v.groupCount)} groups total` : ""}</div></div></div>`,
    stat("Step", v.step === null ? "—" : num(v.step), "step"),
    stat("Reward", num(v.reward)),
    stat("Events", num(lastSeq), "last-seq"),
  ].join("");
}

const BADGE: Record<string, string> = { alive: "st-running", retired: "st-failed", dead: "st-failed", open: "gate-open",
  sealed: "gate-sealed", draining: "gate-draining", installing: "gate-installing", poisoned: "gate-poisoned" };

function cell(v: unknown): string {
  if (v === undefined || v === null) return `<span class="muted">—</span>`;
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return num(v);
  if (typeof v === "string" && BADGE[v]) return `<span class="badge ${BADGE[v]}">${esc(v)}</span>`;
  return esc(Array.isArray(v) ? v.join(", ") : typeof v === "object" ? JSON.stringify(v) : v);
}

/** A table of records; `preferred` columns first (when present), then any other keys, at most 8. */
function table(records: object[], empty: string, label: string, preferred: string[] = []): string {
  if (!records.length) return `<p class="empty">${empty}</p>`;
  const rows = records.map((r) => new Map<string, unknown>(Object.entries(r)));
  const keys = new Set(rows.flatMap((r) => [...r.keys()]));
  const cols = [...preferred.filter((k) => keys.has(k)), ...[...keys].filter((k) => !preferred.includes(k))].slice(0, 8);
  return `<div class="table-wrap panel"><table aria-label="${label}"><thead><tr>${cols.map((c) => `<th scope="col">${esc(c.replace(/_/g, " "))}</th>`).join("")}</tr></thead>
    <tbody>${rows.map((r) => `<tr>${cols.map((c) => `<td class="num">${cell(r.get(c))}</td>`).join("")}</tr>`).join("")}</tbody></table></div>`;
}

function renderWorkers(): string {
  const parts: string[] = [];
  if (topology) {
    const facts = Object.entries(topology).filter(([k]) => k !== "event");
    parts.push(`<dl class="facts">${facts.map(([k, v]) => `<div><dt>${esc(k.replace(/_/g, " "))}</dt><dd>${cell(v)}</dd></div>`).join("")}</dl>`);
  }
  if (lifecycle.length) {
    parts.push(`<ul class="lifecycle">${lifecycle.slice(-8).reverse().map((l) => `<li><span class="num muted">${timeOfDay(l.ts)}</span> <b>${esc(String(l.data.event).replace(/_/g, " "))}</b>${
      l.data.engine != null ? ` ${esc(l.data.engine)}` : ""}${l.data.tombstoned_sessions != null ? ` · ${esc(l.data.tombstoned_sessions)} sessions tombstoned` : ""}</li>`).join("")}</ul>`);
  }
  return parts.join("") || `<p class="empty">No worker reported yet.</p>`;
}

function renderPanels(): void {
  document.getElementById("engines")!.innerHTML = table([...engines.values()], "No engine reported yet.", "Engines",
    ["engine", "id", "status", "state", "version", "active", "waiting", "sessions", "tombstoned_sessions"]);
  document.getElementById("workers")!.innerHTML = renderWorkers();
  serving.render(document.getElementById("serving")!);
  if (agentsCard && (agents.seen || !agentsCard.hidden)) {
    agentsCard.hidden = false;
    agents.render(document.getElementById("agents")!);
  }
  document.getElementById("checkpoints")!.innerHTML = checkpoints.length
    ? `<div class="table-wrap"><table aria-label="Checkpoints"><thead><tr><th scope="col">time</th><th scope="col">step</th><th scope="col">version</th><th scope="col">where</th></tr></thead><tbody>${checkpoints.slice().reverse().map((c) =>
      `<tr><td class="num">${timeOfDay(c.ts)}</td><td class="num">${num(c.data.step)}</td><td class="num">${c.data.version != null ? `v${esc(c.data.version)}` : "—"}</td><td class="mono" style="word-break:break-all">${esc(c.data.path ?? "")}</td></tr>`).join("")}</tbody></table></div>`
    : `<p class="empty">No checkpoint yet.</p>`;
}

const perf: Record<string, number> = {};
function timed(name: string, fn: () => void): void {
  const t = performance.now();
  fn();
  perf[name] = (perf[name] ?? 0) + performance.now() - t;
}

// Each animation frame does at most one DOM-heavy job, and each job runs at most every SLOW_MS: under a
// fast event stream (bench: 50 events/s) no single frame carries charts + timeline + panels + log at once.
const SLOW_MS = 250;
const jobs: { name: string; last: number; dirty: () => boolean; run: () => void }[] = [
  { name: "header", last: 0, dirty: () => headerDirty, run: () => { headerDirty = false; renderHeader(); } },
  { name: "charts", last: 0, dirty: () => charts.dirty, run: () => charts.flush() },
  { name: "heatmap", last: 0, dirty: () => heatmap.dirty, run: () => heatmap.flush() },
  { name: "timeline", last: 0, dirty: () => timeline.dirty, run: () => timeline.flush() },
  { name: "panels", last: 0, dirty: () => panelsDirty, run: () => { panelsDirty = false; renderPanels(); } },
  { name: "log", last: 0, dirty: () => log.dirty, run: () => log.flush() },
];
let next = 0;
let idleTimer = 0;

function draw(): void {
  frame = 0;
  const now = performance.now();
  const waiting = jobs.filter((j) => j.dirty());
  if (!waiting.length) return; // nothing to draw until the next message
  for (let i = 0; i < jobs.length; i++) {
    const job = jobs[(next + i) % jobs.length];
    if (!job.dirty() || now - job.last < SLOW_MS) continue;
    job.last = now;
    next = (next + i + 1) % jobs.length;
    timed(job.name, job.run);
    schedule(); // the others get the next frames
    return;
  }
  // Everything ran recently: look again when the oldest job is due.
  if (!idleTimer) {
    const due = Math.min(...waiting.map((j) => j.last)) + SLOW_MS - now;
    idleTimer = window.setTimeout(() => { idleTimer = 0; schedule(); }, Math.max(0, due));
  }
}

function schedule(): void {
  if (!frame) frame = requestAnimationFrame(draw);
}

const socket = new LiveSocket<RunSnapshotMsg | EventsMsg | TruncatedMsg>({
  url: () => wsUrl(`/ws/runs/${run.id}/?after=${lastSeq}`),
  onMessage: (msg) => {
    if (msg.type === "snapshot") {
      // The snapshot's summary is as of its last_seq; keep what replayed events already folded in.
      run = { ...msg.run, summary: { ...msg.run.summary, ...(lastSeq >= msg.last_seq ? run.summary : {}) } };
      panelsDirty = headerDirty = true;
    } else if (msg.type === "truncated") {
      // Paged replay: only the newest events come over the socket; older ones on request, from the REST API.
      log.older(msg.after, msg.through, (after) => api<StoredEvent[]>("GET", `/api/runs/${run.id}/events/?after=${after}`));
      lastSeq = Math.max(lastSeq, msg.through);
    } else if (msg.type === "events") {
      timed("ingest", () => { for (const ev of msg.events) ingest(ev); });
    }
    schedule();
  },
  onClose: (code) => {
    if (code === 4400) lastSeq = 0; // our seq is ahead of the server's (database reset): start over
    if (code === 4401) { location.href = `/login/?next=${encodeURIComponent(location.pathname)}`; return false; }
    return code !== 4403; // a run this user may not see (another user's or missing): stop
  },
});
Object.assign(window, { __run: { socket, lastSeq: () => lastSeq, timeline, heatmap, perf } }); // for tests

// Active runs: let the lanes grow with the clock even between events.
window.setInterval(() => { if (!FINISHED.has(run.status)) { timeline.flush(true); } }, 1000);

// --- cancel / resume with confirmation (run_actions.ts), gate reset (staff) ------------------------
const message = document.getElementById("action-message")!;
const gateReset = new GateReset(() => run, (ok, text) => {
  message.className = ok ? "alert alert-ok" : "alert alert-error";
  message.textContent = text;
  message.hidden = false;
});
const chat = new ChatPanel(() => run);
runActions({
  run: () => run,
  checkpointStep: () => checkpointStep,
  statusSeq: () => statusSeq,
  replied: (updated) => { run = { ...run, status: updated.status, error: updated.error }; },
  changed: () => { panelsDirty = headerDirty = true; schedule(); },
});
document.getElementById("run-class")!.textContent = CLASS_LABEL[run.run_class] ?? run.run_class;
document.getElementById("run-owner")!.textContent = run.owner;
renderHeader();
renderPanels();
timeline.flush(true);
charts.flush();
heatmap.flush();
log.flush();
