/** A captured sample as GET /api/runs/<id>/samples/ returns it (trainer/sample_schema.py is the source). */

export interface SampleTurn { role: "policy" | "tool"; text: string; version?: number; engine?: string; request?: string }

export interface Sample {
  id: number; step: number; group: number; index: number; prompt_index: number; session: string; engine: string;
  finish_reason: "stop" | "length" | "aborted"; pick: "sampled" | "best" | "worst";
  reward: number; advantage: number; version_min: number; version_max: number; staleness: number; length: number;
  prompt: string; completion: string; ts: string; reward_parts: Record<string, number>; turns?: SampleTurn[];
}

export interface SamplePage { next: string | null; previous: string | null; results: Sample[] }

/** The filters of the API (runs/telemetry/sample_query.py FILTERS) plus its ordering and page parameters. */
export const API_PARAMS = [
  "step", "step_min", "step_max", "reward_lte", "reward_gte", "advantage_lte", "advantage_gte", "staleness_gte",
  "finish_reason", "engine", "group", "prompt_index", "ordering", "limit", "cursor",
];
