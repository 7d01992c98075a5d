/** The run page's metric charts (uPlot): reward, exact-match, loss, samples/s, staleness and the engine/learner
 * log-prob mismatch against step.
 * A click on the reward chart picks the step under the cursor (`onPickStep`: the run page opens its samples). */
import uPlot from "uplot";
import { num } from "./lib/format";
import type { StoredEvent, TrainData } from "./lib/messages";

interface ChartSpec { key: string; title: string; series: { label: string; color: string; pick: (d: TrainData, s: Sample) => number | null }[] }
interface Sample { step: number; ts: number; data: TrainData; samplesPerS: number | null }

const SPECS: ChartSpec[] = [
  { key: "reward", title: "Reward", series: [{ label: "mean reward", color: "--c-app", pick: (d) => d.reward_mean }] },
  { key: "exact_match", title: "Exact match", series: [
    { label: "train", color: "--c-interactive", pick: (d) => d.exact_match },
    { label: "held-out", color: "--c-system", pick: (d) => d.held_out_exact_match ?? null },
  ] },
  { key: "loss", title: "Loss", series: [{ label: "loss", color: "--c-schedule", pick: (d) => d.loss }] },
  { key: "samples", title: "Samples / s", series: [{ label: "samples/s", color: "--info", pick: (_d, s) => s.samplesPerS }] },
  { key: "staleness", title: "Staleness max (versions)", series: [{ label: "max", color: "--bad", pick: (d) => d.staleness_max }] },
  // |engine - learner| log-prob of the tokens sampled with the trained weights (docs/trainer.md, "Log-prob parity").
  { key: "logprob_diff", title: "Log-prob mismatch |engine − learner|", series: [
    { label: "max", color: "--bad", pick: (d) => d.logprob_diff_max ?? null },
    { label: "mean", color: "--warn", pick: (d) => d.logprob_diff_mean ?? null },
  ] },
];

function cssVar(name: string): string {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
}

export class RunCharts {
  private samples: Sample[] = [];
  private plots = new Map<string, uPlot>();
  dirty = false;

  constructor(private root: HTMLElement, private samplesPerStep: number | null, private onPickStep?: (step: number) => void) {
    this.root.innerHTML = SPECS.map((s) => `<figure class="card chart" data-chart="${s.key}" style="margin:0">
      <h3><span id="chart-${s.key}-title">${s.title}</span><span class="last num" data-last="${s.key}">—</span></h3>
      <div class="plot" role="img" aria-labelledby="chart-${s.key}-title" aria-describedby="chart-${s.key}-desc"></div>
      <figcaption class="sr-only" id="chart-${s.key}-desc">No data yet.</figcaption></figure>`).join("");
    this.build();
    new ResizeObserver(() => this.resize()).observe(this.root);
    document.addEventListener("themechange", () => this.build());
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.build());
  }

  /** Feed a train event; returns whether a chart needs redrawing. */
  add(ev: StoredEvent): boolean {
    if (ev.type !== "train") return false;
    const d = ev.data, ts = ev.ts, step = d.step;
    let sps = d.samples_per_s ?? null;
    const prev = this.samples[this.samples.length - 1];
    if (sps === null && prev && ts > prev.ts && this.samplesPerStep !== null) {
      // Without a reported rate: the config's samples per step over the time since the previous step.
      sps = (this.samplesPerStep * Math.max(1, step - prev.step)) / (ts - prev.ts);
    }
    this.samples.push({ step, ts, data: d, samplesPerS: sps });
    this.dirty = true;
    return true;
  }

  private width(): number {
    const fig = this.root.querySelector<HTMLElement>(".chart .plot");
    return Math.max(220, (fig?.clientWidth ?? 320));
  }

  private build(): void {
    for (const p of this.plots.values()) p.destroy();
    this.plots.clear();
    const axis = { stroke: cssVar("--muted"), grid: { stroke: cssVar("--border"), width: 1 }, ticks: { stroke: cssVar("--border"), width: 1 } };
    for (const spec of SPECS) {
      const el = this.root.querySelector<HTMLElement>(`[data-chart="${spec.key}"] .plot`)!;
      const opts: uPlot.Options = {
        width: this.width(), height: 170, legend: { show: false }, cursor: { drag: { x: false, y: false } },
        // A flat series (staleness 0 throughout) gets a small band around it instead of uPlot's 0..100.
        scales: { x: { time: false }, y: { range: (_u, lo, hi) => (lo === hi ? [lo - 1, hi + 1] : uPlot.rangeNum(lo, hi, 0.1, true)) } },
        axes: [{ ...axis, label: "", size: 30 }, { ...axis, size: 48 }],
        series: [{ label: "step" }, ...spec.series.map((s) => ({ label: s.label, stroke: cssVar(s.color), width: 1.8, spanGaps: true, points: { show: false } }))],
      };
      const plot = new uPlot(opts, this.columns(spec), el);
      this.plots.set(spec.key, plot);
      if (spec.key === "reward" && this.onPickStep) {
        el.classList.add("pickable");
        el.title = "Click a point to see that step's samples";
        plot.over.addEventListener("click", () => {
          const i = plot.cursor.idx;
          const step = i === null || i === undefined ? undefined : this.samples[i]?.step;
          if (step !== undefined) this.onPickStep?.(step);
        });
      }
    }
  }

  private columns(spec: ChartSpec): uPlot.AlignedData {
    const xs = this.samples.map((s) => s.step);
    return [xs, ...spec.series.map((ser) => this.samples.map((s) => ser.pick(s.data, s)))] as uPlot.AlignedData;
  }

  private resize(): void {
    const w = this.width();
    for (const p of this.plots.values()) if (Math.abs(p.width - w) > 2) p.setSize({ width: w, height: 170 });
  }

  /** Redraw whatever changed since the last call (called at most once per animation frame). */
  flush(): void {
    if (!this.dirty) return;
    this.dirty = false;
    for (const spec of SPECS) {
      const cols = this.columns(spec);
      this.plots.get(spec.key)?.setData(cols);
      const last = cols[1][cols[1].length - 1] as number | null | undefined;
      const lastEl = this.root.querySelector(`[data-last="${spec.key}"]`);
      if (lastEl) lastEl.textContent = last === null || last === undefined ? "—" : num(last);
      const desc = document.getElementById(`chart-${spec.key}-desc`);
      if (desc) desc.textContent = `${spec.title} over ${cols[0].length} steps; latest ${lastEl?.textContent}.`;
    }
  }
}
