/** Shapes of the platform's JSON (ARCHITECTURE.md section 4) and tolerant readers of a run's summary. */

import type { BoardRun, RunJson, SlotsJson, StoredEvent } from "./messages";

export type { ClassSlots } from "./messages";
export type Slots = SlotsJson;
/** A run as a page holds it: the REST run JSON (run page) or a board row (board), both generated types. */
export type Run = BoardRun & Partial<RunJson> & Pick<RunJson, "id" | "name" | "run_class" | "status">;
export type RunEvent = StoredEvent;

export const ACTIVE = new Set(["starting", "running", "stopping"]);
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

export function ownerName(run: Run): string {
  return run.owner ?? "";
}

export function positions(run: Run): { overall: number | null; inClass: number | null } {
  const p = run.position;
  return p ? { overall: p.overall, inClass: p.in_class } : { overall: null, inClass: null };
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
