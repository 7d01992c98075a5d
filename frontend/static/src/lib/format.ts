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
