/** Shapes of the platform's JSON (ARCHITECTURE.md section 4) and tolerant readers of a run's summary. */

export interface ClassSlots { running: number; waiting: number; limit: number; priority: number }
export interface Slots {
  policy?: { max_total?: number; interactive_reserve?: number; classes?: Record<string, { limit: number; priority: number }> };
  borrowable: number;
  classes: Record<string, ClassSlots>;
  total: { running: number; max_total: number };
}

export interface Run {
  id: number; name: string; origin: string; run_class: string; kind: string; status: string;
  owner: string | number | { username?: string } | null; config?: Record<string, unknown>;
  created_at?: string; granted_at?: string | null; started_at?: string | null; finished_at?: string | null;
  queued_seconds?: number | null; position?: number | { overall?: number; in_class?: number; class?: number } | null;
  pending_reason?: string | null; eta_seconds?: number | null; error?: string; summary?: Record<string, any>;
}

export interface RunEvent { run?: number | string; seq: number; ts: number | string; type: string; data: Record<string, any> }

export const ACTIVE = new Set(["starting", "running", "stopping"]);
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

export function ownerName(run: Run): string {
  const o = run.owner;
  if (o && typeof o === "object") return o.username ?? "";
  return o === null || o === undefined ? "" : String(o);
}

export function positions(run: Run): { overall: number | null; inClass: number | null } {
  const p = run.position;
  if (typeof p === "number") return { overall: p, inClass: null };
  if (p && typeof p === "object") return { overall: p.overall ?? null, inClass: p.in_class ?? p.class ?? null };
  return { overall: null, inClass: null };
}

function pick(obj: any, ...paths: string[]): any {
  for (const path of paths) {
    let cur = obj;
    for (const key of path.split(".")) cur = cur == null ? undefined : cur[key];
    if (cur !== undefined && cur !== null) return cur;
  }
  return undefined;
}

export interface RunView {
  gateState: string | null; version: number | null; epoch: number | null; consumed: number | null;
  datasetSize: number | null; groupCount: number | null; reward: number | null; step: number | null;
  rewardHistory: number[];
}

/** What the board and run header show, read from a run's summary whatever nesting the ingest chose. */
export function runView(run: Run): RunView {
  const s = run.summary ?? {};
  const num = (v: any) => (typeof v === "number" && isFinite(v) ? v : null);
  return {
    gateState: pick(s, "gate.state", "gate_state") ?? null,
    version: num(pick(s, "version.version", "weight_version", "version")),
    epoch: num(pick(s, "sampler.epoch", "epoch")),
    consumed: num(pick(s, "sampler.consumed_in_epoch", "consumed_in_epoch")),
    datasetSize: num(pick(s, "sampler.dataset_size", "dataset_size")),
    groupCount: num(pick(s, "sampler.group_count", "group_count")),
    reward: num(pick(s, "train.reward_mean", "metrics.reward_mean", "reward_mean")),
    step: num(pick(s, "train.step", "metrics.step", "step")),
    rewardHistory: ((run as any).reward_history ?? pick(s, "reward_history", "metrics.reward_history", "train.reward_history") ?? []).filter((v: any) => typeof v === "number"),
  };
}
