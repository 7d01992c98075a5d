/** The run page's distribution heatmaps: per-step histograms of reward, advantage, response length and staleness
 * (the `histograms` of train events, trainer/histograms.py) as one canvas each, steps left to right, buckets
 * bottom to top, colour = share of the step's samples in the bucket.
 *
 * Downsampling: a canvas has at most one column per device pixel; when there are more steps than columns,
 * consecutive steps are summed into one column (counts, then shares), so 10,000 steps cost one pass over the
 * counts and one putImageData (measured by tests/browser/test_compare_heatmap.py). */
import type { HistogramModel, StoredEvent } from "./lib/messages";
import { num } from "./lib/format";

const KEYS: { key: string; title: string }[] = [
  { key: "reward", title: "Reward" },
  { key: "advantage", title: "Advantage" },
  { key: "response_length", title: "Response length (tokens)" },
  { key: "staleness", title: "Staleness (versions)" },
];
const HEIGHT = 120;

// Viridis at 5 stops: dark (few samples) to bright (most of the step's samples), readable in both themes.
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LUT = new Uint8ClampedArray(256 * 3);
for (let i = 0; i < 256; i++) {
  const t = (i / 255) * (RAMP.length - 1);
  const k = Math.min(RAMP.length - 2, Math.floor(t));
  const f = t - k;
  for (let c = 0; c < 3; c++) LUT[i * 3 + c] = Math.round(RAMP[k][c] + (RAMP[k + 1][c] - RAMP[k][c]) * f);
}

interface Series { edges: number[] | null; steps: number[]; counts: number[][] }

/** A histogram the heatmap can draw (the schema bounds its lists; trainer/events.py checks these at ingest). */
function drawable(h: HistogramModel | undefined): h is HistogramModel {
  return h !== undefined && h.counts.length > 0 && h.edges.length === h.counts.length + 1;
}

/** Counts on other edges (a run resumed with another config) moved to the reference buckets by their centres. */
function rebin(h: HistogramModel, edges: number[]): number[] {
  const out = new Array(edges.length - 1).fill(0);
  h.counts.forEach((c, i) => {
    const centre = (h.edges[i] + h.edges[i + 1]) / 2;
    let lo = 0, hi = edges.length - 2;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (edges[mid] <= centre) lo = mid; else hi = mid - 1; }
    out[lo] += c;
  });
  return out;
}

const sameEdges = (a: number[], b: number[]) => a.length === b.length && a.every((v, i) => v === b[i]);

export class RunHeatmap {
  private series = new Map<string, Series>(KEYS.map(({ key }) => [key, { edges: null, steps: [], counts: [] }]));
  private canvases = new Map<string, HTMLCanvasElement>();
  dirty = false;
  lastDrawMs = 0;

  constructor(private root: HTMLElement) {
    for (const { key, title } of KEYS) {
      const fig = document.createElement("figure");
      fig.className = "card heatmap";
      fig.dataset.heatmap = key;
      const h3 = document.createElement("h3");
      h3.textContent = title;
      const range = document.createElement("span");
      range.className = "last num";
      range.dataset.range = key;
      range.textContent = "—";
      h3.append(range);
      const canvas = document.createElement("canvas");
      canvas.height = HEIGHT;
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `${title}: distribution per step`);
      canvas.addEventListener("mousemove", (e) => this.describe(key, canvas, e));
      const axis = document.createElement("div");
      axis.className = "heatmap-axis muted";
      axis.dataset.axis = key;
      fig.append(h3, canvas, axis);
      this.root.append(fig);
      this.canvases.set(key, canvas);
    }
    const legend = document.createElement("p");
    legend.className = "heatmap-legend muted";
    legend.append("share of the step's samples: 0 ", Object.assign(document.createElement("span"), { className: "heatmap-ramp" }), " 1");
    this.root.append(legend);
    new ResizeObserver(() => { this.dirty = true; this.flush(); }).observe(this.root);
  }

  /** Feed an event; train events with `histograms` add one step. */
  add(ev: StoredEvent): boolean {
    if (ev.type !== "train" || !ev.data.histograms) return false;
    const hists = ev.data.histograms;
    for (const { key } of KEYS) {
      const h = hists[key];
      if (!drawable(h)) continue;
      const s = this.series.get(key)!;
      s.edges ??= h.edges.slice();
      s.steps.push(ev.data.step);
      s.counts.push(sameEdges(h.edges, s.edges) ? h.counts : rebin(h, s.edges));
    }
    this.dirty = true;
    return true;
  }

  steps(key = "reward"): number {
    return this.series.get(key)?.steps.length ?? 0;
  }

  /** Redraw every heatmap (at most one column per device pixel). */
  flush(): void {
    if (!this.dirty) return;
    this.dirty = false;
    const t = performance.now();
    for (const { key } of KEYS) this.draw(key);
    this.lastDrawMs = performance.now() - t;
  }

  private columns(canvas: HTMLCanvasElement, n: number): number {
    const width = Math.max(120, Math.round((canvas.clientWidth || 300) * (window.devicePixelRatio || 1)));
    if (canvas.width !== width) canvas.width = width;
    return Math.min(n, width);
  }

  private draw(key: string): void {
    const s = this.series.get(key)!;
    const canvas = this.canvases.get(key)!;
    const ctx = canvas.getContext("2d")!;
    const n = s.steps.length;
    const cols = this.columns(canvas, n);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    if (!n || !s.edges) return;
    const nb = s.edges.length - 1;
    const sums = new Float64Array(cols * nb);
    for (let i = 0; i < n; i++) {
      const base = Math.floor((i * cols) / n) * nb;
      const c = s.counts[i];
      for (let b = 0; b < nb; b++) sums[base + b] += c[b] || 0;
    }
    const image = new ImageData(cols, nb);
    const px = image.data;
    for (let col = 0; col < cols; col++) {
      let total = 0;
      for (let b = 0; b < nb; b++) total += sums[col * nb + b];
      if (!total) continue; // no samples: transparent
      for (let b = 0; b < nb; b++) {
        const share = sums[col * nb + b] / total;
        const lut = Math.round(share * 255) * 3;
        const o = ((nb - 1 - b) * cols + col) * 4; // bucket 0 at the bottom
        px[o] = LUT[lut]; px[o + 1] = LUT[lut + 1]; px[o + 2] = LUT[lut + 2]; px[o + 3] = 255;
      }
    }
    const off = new OffscreenCanvas(cols, nb);
    off.getContext("2d")!.putImageData(image, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, canvas.width, canvas.height);
    this.root.querySelector(`[data-range="${key}"]`)!.textContent = `${num(s.edges[0])} … ${num(s.edges[nb])}`;
    this.root.querySelector(`[data-axis="${key}"]`)!.textContent =
      `steps ${num(s.steps[0])}–${num(s.steps[n - 1])}${cols < n ? ` · ${Math.ceil(n / cols)} steps per column` : ""}`;
    canvas.dataset.columns = String(cols);
  }

  /** The hovered cell in words (canvas title): step range, bucket and share. */
  private describe(key: string, canvas: HTMLCanvasElement, e: MouseEvent): void {
    const s = this.series.get(key)!;
    const n = s.steps.length;
    if (!n || !s.edges) return;
    const rect = canvas.getBoundingClientRect();
    const i = Math.min(n - 1, Math.max(0, Math.floor(((e.clientX - rect.left) / rect.width) * n)));
    const nb = s.edges.length - 1;
    const b = Math.min(nb - 1, Math.max(0, nb - 1 - Math.floor(((e.clientY - rect.top) / rect.height) * nb)));
    const total = s.counts[i].reduce((a, c) => a + c, 0);
    canvas.title = `step ${s.steps[i]}: ${s.counts[i][b]} of ${total} samples in [${num(s.edges[b])}, ${num(s.edges[b + 1])})`;
  }
}
