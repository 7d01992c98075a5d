/** The run page's Agents panel, for runs with an agent environment: folded from the job's `agents` events (one per
 * training step; trainer/reports.py agents_data). It shows the latest live sessions per engine, requests waiting
 * at the gate, the session servers' 400/409/410/503 answers, requests and tokens served, tool calls, valid tool
 * calls and tool errors, and a small SVG chart over steps of the valid tool-call rate (each step's new valid calls
 * over its new calls) and the mean of each reward part. Everything is built with DOM nodes and textContent
 * (lib/dom.ts): engine and part names come from the job and are never parsed as markup. */
import { el } from "./lib/dom";
import { num } from "./lib/format";
import type { AgentsData, StoredEvent } from "./lib/messages";

const SVG = "http://www.w3.org/2000/svg";
const STEPS_MAX = 500; // points kept for the chart
const PARTS_MAX = 6; // reward parts drawn (the first by name); the table lists them all
const COLORS = ["--c-app", "--c-schedule", "--c-system", "--warn", "--bad", "--muted"];
const STATUSES: [keyof AgentsData["status"], string][] = [["400", "400 refused"], ["409", "409 busy session"], ["410", "410 session gone"], ["503", "503 full or timed out"]];

interface Point { step: number; validRate: number | null; parts: Record<string, number> }

function cssVar(name: string): string {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string>): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

export class AgentsPanel {
  private latest: AgentsData | null = null;
  private points: Point[] = [];

  /** Feed any event; returns whether it was an agents event. */
  add(ev: StoredEvent): boolean {
    if (ev.type !== "agents") return false;
    const d = ev.data;
    const prev = this.latest;
    let calls = d.tool_calls, valid = d.valid_tool_calls;
    // The counters are cumulative since the job's attempt started; a resumed job starts them again.
    if (prev && calls >= prev.tool_calls) {
      calls -= prev.tool_calls;
      valid -= prev.valid_tool_calls;
    }
    this.points.push({ step: d.step, validRate: calls > 0 ? valid / calls : null, parts: d.reward_parts });
    if (this.points.length > STEPS_MAX) this.points.shift();
    this.latest = d;
    return true;
  }

  get seen(): boolean {
    return this.latest !== null;
  }

  render(root: HTMLElement): void {
    const d = this.latest;
    if (!d) {
      root.replaceChildren(el("p", { class: "empty" }, "No agents report yet (one arrives per training step)."));
      return;
    }
    const status = d.status;
    const stat = (label: string, text: string, testid: string) =>
      el("div", { class: "stat" }, el("div", { class: "l" }, label), el("div", { class: "v num", "data-testid": testid }, text));
    const calls = d.tool_calls;
    const rate = calls ? d.valid_tool_calls / calls : null;
    const stats = el("div", { class: "stats" },
      stat("Live sessions", num(d.sessions), "agents-sessions"),
      stat("Waiting at the gate", num(d.waiting), "agents-waiting"),
      ...STATUSES.map(([code, label]) => stat(label, num(status[code] ?? 0), `agents-${code}`)),
      stat("Requests", num(d.requests), "agents-requests"),
      stat("Tokens", num(d.tokens), "agents-tokens"),
      stat("Episodes", num(d.episodes), "agents-episodes"),
      stat("Tool calls", num(d.tool_calls), "agents-tool-calls"),
      stat("Valid tool calls", `${num(d.valid_tool_calls)}${rate === null ? "" : ` (${num(rate * 100)}%)`}`, "agents-valid"),
      stat("Tool errors", num(d.tool_errors), "agents-tool-errors"),
    );
    const engines = Object.entries(d.sessions_per_engine).slice(0, 32);
    const parts = Object.entries(d.reward_parts);
    root.replaceChildren(
      stats,
      el("div", { class: "grid grid-2" },
        this.table("Sessions per engine", ["engine", "live sessions"], engines, "agents-engine"),
        this.table(`Reward parts (step ${num(d.step)})`, ["part", "mean"], parts, "agents-part")),
      this.chart(),
    );
  }

  private table(label: string, head: [string, string], rows: [string, number][], testid: string): HTMLElement {
    if (!rows.length) return el("p", { class: "empty" }, `${label}: none.`);
    return el("div", { class: "table-wrap" },
      el("table", { "aria-label": label },
        el("caption", { class: "sr-only" }, label),
        el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, ...rows.map(([name, v]) =>
          el("tr", { "data-testid": testid }, el("td", {}, name), el("td", { class: "num" }, num(v)))))));
  }

  /** Valid tool-call rate and reward parts against step, on one 0..1-or-wider scale. */
  private chart(): HTMLElement {
    const pts = this.points;
    const names = [...new Set(pts.flatMap((p) => Object.keys(p.parts)))].sort().slice(0, PARTS_MAX);
    const series: { label: string; color: string; ys: (number | null)[] }[] = [
      { label: "valid tool-call rate", color: "--info", ys: pts.map((p) => p.validRate) },
      ...names.map((name, i) => ({ label: `reward part ${name}`, color: COLORS[i % COLORS.length], ys: pts.map((p) => p.parts[name] ?? null) })),
    ].filter((s) => s.ys.some((y) => y !== null));
    const W = 480, H = 140, PAD = 6;
    const values = series.flatMap((s) => s.ys.filter((y): y is number => y !== null));
    const lo = Math.min(0, ...values), hi = Math.max(1, ...values);
    const steps = pts.map((p) => p.step);
    const x0 = Math.min(...steps), x1 = Math.max(...steps);
    const x = (s: number) => PAD + (x1 > x0 ? ((s - x0) / (x1 - x0)) * (W - 2 * PAD) : (W - 2 * PAD) / 2);
    const y = (v: number) => H - PAD - ((v - lo) / (hi - lo)) * (H - 2 * PAD);
    const last = (ys: (number | null)[]) => [...ys].reverse().find((v) => v !== null) ?? null;
    const text = series.map((s) => `${s.label} latest ${num(last(s.ys))}`).join("; ");
    const plot = svg("svg", { class: "agents-chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    plot.setAttribute("aria-label", `Over ${pts.length} steps: ${text || "no data yet"}`);
    const axis = svg("line", { x1: String(PAD), x2: String(W - PAD), y1: y(0).toFixed(1), y2: y(0).toFixed(1) });
    axis.style.stroke = cssVar("--border");
    plot.append(axis);
    for (const s of series) {
      const d = s.ys.map((v, i) => (v === null ? "" : `${x(steps[i]).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean);
      const line = svg(d.length > 1 ? "polyline" : "circle", d.length > 1 ? { points: d.join(" "), fill: "none" } : { cx: d[0].split(",")[0], cy: d[0].split(",")[1], r: "3" });
      line.style.stroke = cssVar(s.color);
      line.style.strokeWidth = "1.8";
      if (d.length <= 1) line.style.fill = cssVar(s.color);
      plot.append(line);
    }
    const legend = el("ul", { class: "agents-legend", "data-testid": "agents-legend" }, ...series.map((s) => {
      const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
      swatch.style.background = cssVar(s.color);
      return el("li", {}, swatch, `${s.label}: ${num(last(s.ys))}`);
    }));
    return el("figure", { class: "agents-figure", "data-testid": "agents-chart" },
      el("figcaption", {}, `Valid tool-call rate and reward parts over steps (scale ${num(lo)} to ${num(hi)})`), plot, legend);
  }
}
