/** Folds /ws/dashboard/ messages (types: lib/messages.ts, generated from runs/messages.py; rules:
 * docs/realtime.md) into the board's state; pure, so it is easy to follow.
 * snapshot {slots, queue, active, cluster} replaces everything (a change of Ray's reachability arrives as one); run {run} moves one run between the lists (a queued
 * run's row carries its exact position); slots {slots, queue: {joined, left, reasons, rate}} replaces the counts
 * and moves the waiting rows behind each slot that joined or left the line, whatever the queue length. */
import type { BoardRun, ClusterJson, DashboardRunMsg, DashboardSlotsMsg, DashboardSnapshotMsg, QueueChange, QueueKey, SlotsJson } from "./lib/messages";

export interface BoardState { slots: SlotsJson | null; queued: BoardRun[]; running: BoardRun[]; cluster?: ClusterJson | null }

/** Reasons that belong to one run (its own demand), kept when a queue change only says "higher priority". */
const RUN_REASONS = new Set(["insufficient_resources", "gpu_limit_reached", "user_limit_reached", "team_quota_reached"]);
export type DashboardMsg = DashboardSnapshotMsg | DashboardRunMsg | DashboardSlotsMsg;

/** Whether the waiting slot `key` comes before `run` in grant order (priority, then request time). */
function ahead(key: QueueKey, run: BoardRun, priority: (cls: string) => number): boolean {
  const pk = priority(key.run_class), pr = priority(run.run_class);
  if (pk !== pr) return pk > pr;
  return run.requested_at != null && key.requested_at < run.requested_at;
}

/** Positions, reasons and ETAs of the waiting rows after `change` (the server computes the same numbers for
 * a snapshot: runs.selectors.runs_queue_info). */
export function applyQueueChange(state: BoardState, change: QueueChange): void {
  const classes = state.slots?.classes ?? {};
  const priority = (cls: string) => classes[cls]?.priority ?? 0;
  const moves: [QueueKey[], number][] = [[change.joined ?? [], 1], [change.left ?? [], -1]];
  const now = Date.now() / 1000;
  const most = state.queued.reduce((m, r) => Math.max(m, (r.position?.overall ?? 0) + (change.joined?.length ?? 0)), 0);
  const starts = queueStarts(change.finishes ?? [], change.run_seconds ?? null, now, Math.min(most, 10000));
  state.queued = state.queued.map((run) => {
    const p = run.position;
    if (!p) return run;
    let overall = p.overall, inClass = p.in_class;
    for (const [keys, step] of moves) {
      for (const key of keys) {
        if (!ahead(key, run, priority)) continue;
        overall += step;
        if (key.run_class === run.run_class) inClass += step;
      }
    }
    overall = Math.max(1, overall);
    return {
      ...run, position: { overall, in_class: Math.max(1, inClass) },
      pending_reason: classReason(change.reasons?.[run.run_class], run.pending_reason),
      eta_seconds: queueEta(overall, starts, change.rate, now),
    };
  });
}

/** Predicted start times (seconds since the epoch) of queue positions 1..n: the p-th slot to free, the held
 * runs freeing theirs at `finishes` and a run started at t freeing its slot at t + runSeconds (the server's
 * runs.scheduling.progress.queue_starts). null where no prediction reaches. */
export function queueStarts(finishes: number[], runSeconds: number | null, now: number, n: number): (number | null)[] {
  const heap = finishes.map((f) => Math.max(now, f)).sort((a, b) => a - b);
  const out: (number | null)[] = [];
  for (let i = 0; i < n; i++) {
    const start = heap.shift();
    if (start === undefined) { out.push(null); continue; }
    out.push(start);
    if (runSeconds && runSeconds > 0) {
      const next = start + runSeconds;
      let k = heap.findIndex((x) => x > next);
      if (k < 0) k = heap.length;
      heap.splice(k, 0, next);
    }
  }
  return out;
}

/** A queued run's ETA (seconds): its position's predicted start, else its position over the grant rate. */
function queueEta(overall: number, starts: (number | null)[], rate: number | null | undefined, now: number): number | null {
  const start = starts[overall - 1];
  if (start !== null && start !== undefined) return Math.round((start - now) * 10) / 10;
  return rate ? Math.round((overall / rate) * 10) / 10 : null;
}

function classReason(byClass: string | undefined, own: string | null | undefined): string | null {
  if (byClass === undefined) return own ?? null;
  if (byClass === "higher_priority_waiting" && own && RUN_REASONS.has(own)) return own;
  return byClass;
}

/** Apply one message; returns whether anything changed. */
export function applyDashboardMessage(state: BoardState, msg: DashboardMsg, finished: Set<string>): boolean {
  switch (msg.type) {
    case "snapshot":
      state.slots = msg.slots;
      state.cluster = msg.cluster;
      state.queued = msg.queue;
      state.running = msg.active;
      return true;
    case "slots":
      state.slots = msg.slots;
      applyQueueChange(state, msg.queue);
      return true;
    case "run": {
      const run = msg.run;
      const prev = state.queued.find((r) => r.id === run.id) ?? state.running.find((r) => r.id === run.id);
      const merged: BoardRun = prev ? { ...prev, ...run } : run;
      state.queued = state.queued.filter((r) => r.id !== run.id);
      state.running = state.running.filter((r) => r.id !== run.id);
      if (merged.status === "queued") state.queued.push(merged);
      else if (!finished.has(merged.status)) state.running.push(merged);
      return true;
    }
    default:
      return false;
  }
}
