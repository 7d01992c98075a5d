/** Run comparison page (/compare/?runs=1,2,3&metric=reward_mean&x=step): one metric of up to 10 runs overlaid
 * (uPlot), aligned by step or by wall time since each run started, and the config keys that differ.
 * Data: the page embeds GET /api/runs/compare/'s JSON (runs.telemetry.compare). Run names, metric names and config values
 * are user data: they reach the DOM through textContent and attribute setters only, never as HTML. */
import uPlot from "uplot";
import { embedded } from "./lib/api";
import { num, runHref } from "./lib/format";
import type { CompareJson, CompareRun } from "./lib/messages";

// Tableau 10: distinct in both themes, one per run (at most 10 runs).
const COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
type Align = "step" | "time";

const data = embedded<CompareJson>("compare-data")!;
const params = new URLSearchParams(location.search);
const state: { metric: string; x: Align } = {
  metric: data.metrics.includes(params.get("metric") ?? "") ? params.get("metric")! : (data.metrics.includes("reward_mean") ? "reward_mean" : data.metrics[0] ?? ""),
  x: params.get("x") === "time" ? "time" : "step",
};
let plot: uPlot | null = null;
let focused: number | null = null; // id of the highlighted run

function el<K extends keyof HTMLElementTagNameMap>(tag: K, text?: string, cls?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (cls) node.className = cls;
  return node;
}

function cssVar(name: string): string {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

/** The URL keeps the selection: runs as asked, the metric and the alignment (no reload). */
function keepInUrl(): void {
  const url = new URL(location.href);
  url.searchParams.set("metric", state.metric);
  url.searchParams.set("x", state.x);
  history.replaceState(null, "", url);
}

/** One run's [x, y] columns: x ascending, one y per x (the last wins, e.g. a step repeated after a resume). */
function table(run: CompareRun): [number[], (number | null)[]] {
  const xs = state.x === "step" ? run.step : run.elapsed;
  const ys = run.metrics[state.metric] ?? [];
  const byX = new Map<number, number | null>();
  xs.forEach((x, i) => byX.set(x, ys[i] ?? null));
  const sorted = [...byX.keys()].sort((a, b) => a - b);
  return [sorted, sorted.map((x) => byX.get(x) ?? null)];
}

function highlight(runId: number | null): void {
  focused = runId;
  for (const li of document.querySelectorAll<HTMLElement>("#compare-legend li")) {
    li.classList.toggle("focused", li.dataset.run === String(runId));
    li.classList.toggle("dimmed", runId !== null && li.dataset.run !== String(runId));
  }
}

function drawPlot(): void {
  const root = document.getElementById("compare-plot")!;
  plot?.destroy();
  plot = null;
  document.getElementById("compare-chart-title")!.textContent = state.metric
    ? `${state.metric} by ${state.x === "step" ? "step" : "wall time (s since start)"}`
    : "No train metrics yet";
  if (!data.runs.length || !state.metric) return;
  const joined = uPlot.join(data.runs.map(table) as uPlot.AlignedData[]);
  const axis = { stroke: cssVar("--muted"), grid: { stroke: cssVar("--border"), width: 1 }, ticks: { stroke: cssVar("--border"), width: 1 } };
  const opts: uPlot.Options = {
    width: Math.max(320, root.clientWidth), height: 360, legend: { show: false },
    focus: { alpha: 0.2 },
    cursor: { focus: { prox: 30 }, drag: { x: true, y: false } },
    scales: { x: { time: false }, y: { range: (_u, lo, hi) => (lo === hi ? [lo - 1, hi + 1] : uPlot.rangeNum(lo, hi, 0.1, true)) } },
    axes: [{ ...axis, label: state.x === "step" ? "step" : "seconds since start", size: 40 }, { ...axis, size: 56 }],
    series: [{ label: state.x }, ...data.runs.map((r, i) => ({ label: `#${r.id}`, stroke: COLORS[i % COLORS.length], width: 1.8, spanGaps: true, points: { show: false } }))],
    hooks: {
      // Hovering near a line focuses it (uPlot dims the others); the legend follows.
      setSeries: [(_u, i) => highlight(i === null ? null : data.runs[i - 1]?.id ?? null)],
    },
  };
  plot = new uPlot(opts, joined, root);
}

function drawLegend(): void {
  const legend = document.getElementById("compare-legend")!;
  legend.replaceChildren(...data.runs.map((run, i) => {
    const li = el("li");
    li.dataset.run = String(run.id);
    li.tabIndex = 0;
    const sw = el("span", undefined, "sw");
    sw.style.background = COLORS[i % COLORS.length];
    const link = el("a", run.name);
    link.href = runHref(run.id);
    li.append(sw, link, el("span", ` #${run.id} · ${run.status} · ${num(run.steps)} steps${run.stride > 1 ? ` (every ${run.stride}th drawn)` : ""}`, "muted"));
    const focus = () => plot?.setSeries(i + 1, { focus: true });
    const blur = () => plot?.setSeries(null, { focus: true });
    li.addEventListener("mouseenter", focus);
    li.addEventListener("focus", focus);
    li.addEventListener("mouseleave", blur);
    li.addEventListener("blur", blur);
    return li;
  }));
}

function show(value: unknown, missing: boolean): HTMLTableCellElement {
  const td = el("td", missing ? "—" : JSON.stringify(value), missing ? "mono muted" : "mono");
  if (missing) td.title = "not set in this run's config";
  return td;
}

function drawDiff(): void {
  const root = document.getElementById("compare-diff")!;
  if (data.runs.length < 2) {
    root.replaceChildren(el("p", "Pick at least two runs to compare their configs.", "empty"));
    return;
  }
  if (!data.config_diff.length) {
    root.replaceChildren(el("p", "The configs of these runs are identical.", "empty"));
    return;
  }
  const tableEl = el("table");
  tableEl.setAttribute("aria-label", "Config keys that differ");
  const head = el("tr");
  head.append(el("th", "key"), ...data.runs.map((r) => el("th", `${r.name} (#${r.id})`)));
  head.querySelectorAll("th").forEach((th) => th.setAttribute("scope", "col"));
  const body = el("tbody");
  for (const row of data.config_diff) {
    const tr = el("tr");
    tr.dataset.key = row.key;
    const key = el("th", row.key, "mono");
    key.setAttribute("scope", "row");
    tr.append(key, ...row.values.map((v, i) => show(v, row.missing[i])));
    body.append(tr);
  }
  const thead = el("thead");
  thead.append(head);
  tableEl.append(thead, body);
  root.replaceChildren(tableEl);
}

function drawControls(): void {
  const select = document.getElementById("compare-metric") as HTMLSelectElement;
  select.replaceChildren(...data.metrics.map((m) => { const o = el("option", m); o.value = m; return o; }));
  select.value = state.metric;
  select.addEventListener("change", () => { state.metric = select.value; keepInUrl(); drawPlot(); });
  for (const radio of document.querySelectorAll<HTMLInputElement>('input[name="x"]')) {
    radio.checked = radio.value === state.x;
    radio.addEventListener("change", () => { if (radio.checked) { state.x = radio.value as Align; keepInUrl(); drawPlot(); } });
  }
  const missing = document.getElementById("compare-missing")!;
  missing.hidden = !data.not_found.length;
  missing.textContent = data.not_found.length ? `Not found: ${data.not_found.map((id) => `run ${id}`).join(", ")}.` : "";
}

drawControls();
drawLegend();
drawDiff();
drawPlot();
keepInUrl();
new ResizeObserver(() => { const w = document.getElementById("compare-plot")!.clientWidth; if (plot && Math.abs(plot.width - w) > 2) plot.setSize({ width: Math.max(320, w), height: 360 }); })
  .observe(document.getElementById("compare-plot")!);
document.addEventListener("themechange", drawPlot);
// For tests and debugging: what is drawn.
Object.assign(window, { __compare: {
  plot: () => plot,
  focused: () => focused,
  state,
  series: () => (plot ? plot.series.slice(1).map((s, i) => ({ label: s.label, points: (plot!.data[i + 1] as unknown[]).filter((v) => typeof v === "number").length })) : []),
} });
