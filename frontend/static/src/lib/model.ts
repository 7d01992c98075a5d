/** Readers of the platform's JSON shared by the pages. The types are lib/messages.ts, generated from
 * runs/messages.py, runs/summary_types.py and the trainer's event models, so `tsc` checks every read here. */

import type { BoardRun, BoardSummary, RunJson, RunSummary } from "./messages";

export const ACTIVE = new Set(["starting", "running", "stopping"]);
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

export function positions(run: BoardRun | RunJson): { overall: number | null; inClass: number | null } {
  const p = run.position;
  return p ? { overall: p.overall, inClass: p.in_class } : { overall: null, inClass: null };
}

export interface RunView {
  gateState: string | null; version: number | null; epoch: number | null; consumed: number | null;
  datasetSize: number | null; groupCount: number | null; reward: number | null; step: number | null;
}

/** What the board and the run header show of a run summary: the latest gate, version, sampler and train data
 * as the ingest folds them (runs.telemetry.ingest.summary_fold; a board row gets the cut runs.telemetry.dashboard.board_summary
 * makes). Each is null until the run reports it. */
export function runView(summary: RunSummary | BoardSummary | undefined): RunView {
  const sampler = summary?.sampler;
  return {
    gateState: summary?.gate?.state ?? null,
    version: summary?.version?.version ?? null,
    epoch: sampler?.epoch ?? null,
    consumed: sampler?.consumed_in_epoch ?? null,
    datasetSize: sampler?.dataset_size ?? null,
    groupCount: sampler?.group_count ?? null,
    reward: summary?.train?.reward_mean ?? null,
    step: summary?.train?.step ?? null,
  };
}
