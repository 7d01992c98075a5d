/** Formatting and escaping shared by every page: HTML escape, durations, numbers, pending reasons in words.
 *
 * `esc` is THE escape helper: every value that is not a literal of this code (run names, event data, errors,
 * config values, anything from the server) goes through it before it is put into an HTML string, in text and
 * in attribute values alike (attributes are always double-quoted). Prefer textContent/setAttribute where a
 * single node is set; `runHref` is the only way a link to a run is built (from its numeric id, never a name).
 */

export function esc(value: unknown): string {
  return String(value ?? "").replace(/[&<>"'`]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;", "`": "&#96;" })[c]!);
}

/** The run page's URL, from the numeric id only (a non-integer id links nowhere: never a javascript: URL). */
export function runHref(id: unknown): string {
  return typeof id === "number" && Number.isSafeInteger(id) && id > 0 ? `/runs/${id}/` : "#";
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(s / 3600);
  if (h < 48) return `${h}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

export function ms(msValue: number): string {
  if (msValue < 1000) return `${Math.round(msValue)} ms`;
  return duration(msValue / 1000);
}

export function num(value: unknown, digits = 3): string {
  if (typeof value !== "number" || !isFinite(value)) return "—";
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  const abs = Math.abs(value);
  if (abs >= 1000) return value.toLocaleString("en-US", { maximumFractionDigits: 0 });
  return value.toPrecision(digits).replace(/\.?0+$/, "");
}

export function eta(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return "unknown";
  if (seconds <= 0) return "any moment";
  return `~${duration(seconds)}`;
}

export function timeOfDay(tsSeconds: number): string {
  const d = new Date(tsSeconds * 1000);
  return d.toLocaleTimeString("en-GB", { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

const REASONS: Record<string, string> = {
  class_limit_reached: "Its class is at its concurrency limit",
  global_limit_reached: "Every slot on the platform is in use",
  reserve_protected: "Free slots are held back for interactive runs",
  higher_priority_waiting: "Runs of higher priority are ahead in line",
  gpu_limit_reached: "Its class holds as many GPUs as its GPU limit allows",
  insufficient_resources: "Not enough free CPU, GPU or memory on the cluster",
  user_limit_reached: "Its owner holds as many runs of its class as the per-user limit allows",
  team_quota_reached: "Its team holds its quota of the class (and may borrow no more now)",
  waiting_for_resources: "Granted; waiting for Ray to place all of its processes",
  starting_processes: "Placed; its processes are starting",
};

/** A resource vector (Ray JSON units) in words: "1.5 CPU · 1 GPU · 2 GiB". */
export function resText(r: Record<string, unknown> | null | undefined): string {
  if (!r) return "—";
  const n = (v: unknown) => (typeof v === "number" ? v : 0);
  const gib = n(r.memory) / 2 ** 30;
  const mem = gib >= 1 ? `${+gib.toFixed(2)} GiB` : `${+(n(r.memory) / 2 ** 20).toFixed(0)} MiB`;
  return `${+n(r.CPU).toFixed(3)} CPU · ${+n(r.GPU).toFixed(3)} GPU · ${mem}`;
}

/** A pending detail in words (insufficient_resources: needs vs free). */
export function detailText(detail: Record<string, unknown> | null | undefined): string {
  if (!detail) return "";
  if (typeof detail.message === "string" && !detail.needs) return detail.message;
  if (detail.needs) {
    const msg = typeof detail.message === "string" ? `${detail.message}; ` : "";
    return `${msg}needs ${resText(detail.needs as Record<string, unknown>)}; free ${resText(detail.free as Record<string, unknown>)}`;
  }
  if (typeof detail.gpu_limit === "number") return `holds ${detail.held_gpus} of ${detail.gpu_limit} GPUs`;
  if (typeof detail.max_running_per_user === "number") return `owner holds ${detail.held} of ${detail.max_running_per_user}`;
  if (typeof detail.quota === "number") {
    const team = typeof detail.team === "string" ? `team ${detail.team}` : "runs of owners in no team";
    const borrow = typeof detail.borrowing_limit === "number" ? `, may borrow ${detail.borrowing_limit}` : "";
    return `${team} holds ${detail.held} of its quota ${detail.quota}${borrow}`;
  }
  return "";
}

export function reasonText(reason: string | null | undefined): string {
  if (!reason) return "Waiting for the next grant";
  return REASONS[reason] ?? reason.replace(/_/g, " ");
}

export const CLASSES = ["interactive", "app", "schedule", "system"] as const;
export const CLASS_LABEL: Record<string, string> = {
  interactive: "Interactive", app: "App", schedule: "Schedule", system: "System",
};

/** GET /api/runs/<id>/priority/ `factors` as plain text lines (for a title attribute, set as text). */
export interface PriorityFactors {
  class_priority: number; waited_seconds: number; effective_priority: number; order: string;
  aging: { per_hour: number; cap: number; bonus: number };
  max_wait: { seconds: number | null; overdue: boolean };
  fair_share: { enabled: boolean; usage: number; weight: number; rank: number | null; owners: number };
  user_limit: { max_running_per_user: number | null; held: number; reached: boolean };
  team?: { enabled: boolean; team: string | null; quota: number | null; held: number; borrowing_limit: number | null; state: string | null };
}

export function priorityText(f: PriorityFactors | null): string {
  if (!f) return "Not waiting";
  const lines = [
    `Class priority ${f.class_priority}${f.aging.bonus ? ` + aging ${f.aging.bonus} (${f.aging.per_hour}/h, cap ${f.aging.cap})` : ""} = ${f.effective_priority}`,
    f.max_wait.seconds === null ? "No maximum wait" : `Max wait ${f.max_wait.seconds} s: ${f.max_wait.overdue ? "overdue, goes first" : "not reached"}`,
    f.fair_share.enabled ? `Fair share: owner usage ${f.fair_share.usage} (weight ${f.fair_share.weight}), rank ${f.fair_share.rank} of ${f.fair_share.owners} owners` : "Fair share off: first come, first served",
    f.user_limit.max_running_per_user === null ? "No per-user limit" : `Per-user limit: owner holds ${f.user_limit.held} of ${f.user_limit.max_running_per_user}`,
    !f.team?.enabled ? "No team quotas" : `Team ${f.team.team ?? "(no team)"}: holds ${f.team.held} of its quota ${f.team.quota}${f.team.borrowing_limit === null ? "" : `, borrowing up to ${f.team.borrowing_limit}`} (${(f.team.state ?? "").replace(/_/g, " ")})`,
    `Order: ${f.order}`,
  ];
  return lines.join("\n");
}
