/** Gate timeline (open, sealed, draining, installing, poisoned, with durations) drawn on the same time axis
 * as the weight-version timeline, so a publication lines up with the gate window that produced it. */
import { esc, ms, num, timeOfDay } from "./lib/format";
import type { StoredEvent } from "./lib/messages";

interface Mark { ts: number; value: string }
const STATES = ["open", "sealed", "draining", "installing", "poisoned"];

export class Timeline {
  gates: Mark[] = [];
  versions: { ts: number; version: number; pauseMs: number }[] = [];
  start: number | null = null;
  end: number | null = null; // set when the run is finished; otherwise the lanes extend to now
  dirty = false;

  constructor(private root: HTMLElement) {}

  add(ev: StoredEvent): boolean {
    const ts = ev.ts;
    // The axis starts where the gate first reports (time queued or launching is not gate time).
    if ((ev.type === "gate" || ev.type === "version") && (this.start === null || ts < this.start)) this.start = ts;
    if (ev.type === "gate") {
      const last = this.gates[this.gates.length - 1];
      if (!last || last.value !== ev.data.state) this.gates.push({ ts, value: ev.data.state });
      this.dirty = true;
      return true;
    }
    if (ev.type === "version") {
      this.versions.push({ ts: ev.data.published_at, version: ev.data.version, pauseMs: ev.data.pause_ms });
      this.dirty = true;
      return true;
    }
    return false;
  }

  /** Time spent in each gate state, in seconds. */
  totals(now: number): Record<string, number> {
    const out: Record<string, number> = {};
    this.gates.forEach((g, i) => {
      const until = i + 1 < this.gates.length ? this.gates[i + 1].ts : now;
      out[g.value] = (out[g.value] ?? 0) + Math.max(0, until - g.ts);
    });
    return out;
  }

  /** Redraw (the lanes are canvases: hundreds of publications would be thousands of DOM nodes). */
  flush(force = false): void {
    if (!this.dirty && !force) return;
    this.dirty = false;
    if (this.start === null || (!this.gates.length && !this.versions.length)) {
      if (!this.root.querySelector(".empty")) this.root.innerHTML = `<p class="empty">No gate or weight-version events yet.</p>`;
      return;
    }
    if (!this.gateCanvas) this.build();
    const now = this.end ?? Date.now() / 1000;
    const t0 = this.start, span = Math.max(1e-3, now - t0);
    const colors = this.colors();
    const draw = (canvas: HTMLCanvasElement, paint: (ctx: CanvasRenderingContext2D, w: number, h: number, x: (t: number) => number) => void) => {
      const dpr = window.devicePixelRatio || 1;
      const w = Math.max(50, canvas.parentElement!.clientWidth), h = 26;
      if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = h * dpr; canvas.style.width = `${w}px`; canvas.style.height = `${h}px`; }
      const ctx = canvas.getContext("2d")!;
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      paint(ctx, w, h, (t) => ((Math.max(t0, Math.min(now, t)) - t0) / span) * w);
    };
    draw(this.gateCanvas!, (ctx, _w, h, x) => {
      this.gates.forEach((g, i) => {
        const until = i + 1 < this.gates.length ? this.gates[i + 1].ts : now;
        const left = x(g.ts);
        ctx.fillStyle = colors[g.value] ?? colors.muted;
        ctx.fillRect(left, 0, Math.max(1, x(until) - left), h);
      });
    });
    draw(this.versionCanvas!, (ctx, _w, h, x) => {
      ctx.font = "700 11px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      this.versions.forEach((v, i) => {
        const until = i + 1 < this.versions.length ? this.versions[i + 1].ts : now;
        const left = x(v.ts), width = Math.max(1, x(until) - left);
        ctx.globalAlpha = i % 2 ? 0.35 : 0.6;
        ctx.fillStyle = colors.accent;
        ctx.fillRect(left, 0, width, h);
        ctx.globalAlpha = 1;
        ctx.fillStyle = colors.bg;
        ctx.fillRect(left + width - 1, 0, 1, h);
        const label = `v${v.version}`;
        if (width > ctx.measureText(label).width + 8) { ctx.fillStyle = colors.text; ctx.fillText(label, left + 4, h / 2); }
      });
    });
    this.gateCanvas!.parentElement!.dataset.segments = String(this.gates.length);
    this.versionCanvas!.parentElement!.dataset.segments = String(this.versions.length);

    const totals = this.totals(now);
    const pauses = this.versions.map((v) => v.pauseMs);
    const meanPause = pauses.length ? pauses.reduce((a, b) => a + b, 0) / pauses.length : null;
    const latest = this.gates[this.gates.length - 1]?.value ?? "none";
    const lastVersion = this.versions[this.versions.length - 1]?.version;
    this.axis!.innerHTML = [0, 0.25, 0.5, 0.75, 1].map((f) => `<span style="left:${(f * 100).toFixed(1)}%">${f === 0 ? timeOfDay(t0).slice(0, 8) : `+${ms(f * span * 1000)}`}</span>`).join("");
    this.summary!.innerHTML = `
        <span>Now <b data-testid="gate-now">${esc(latest)}</b></span>
        ${STATES.map((st) => `<span><span class="sw" style="display:inline-block;width:.7rem;height:.7rem;border-radius:3px;background:var(--g-${st});vertical-align:-1px"></span> ${st} <b>${ms((totals[st] ?? 0) * 1000)}</b></span>`).join("")}
        <span>${this.versions.length} publications${lastVersion !== undefined ? `, latest <b>v${esc(lastVersion)}</b>` : ""}${meanPause !== null ? `, mean pause <b>${num(meanPause)} ms</b>` : ""}</span>`;
  }

  private gateCanvas?: HTMLCanvasElement;
  private versionCanvas?: HTMLCanvasElement;
  private axis?: HTMLElement;
  private summary?: HTMLElement;
  private palette?: Record<string, string>;

  private build(): void {
    this.root.innerHTML = `
      <div class="timeline">
        <div class="lane-label" id="lane-gate">Gate</div>
        <div class="lane" role="img" aria-labelledby="lane-gate" aria-describedby="gate-summary" data-testid="gate-lane"><canvas></canvas></div>
        <div class="lane-label" id="lane-ver">Weights</div>
        <div class="lane" role="img" aria-labelledby="lane-ver" aria-describedby="gate-summary" data-testid="version-lane"><canvas></canvas></div>
        <div></div><div class="axis" aria-hidden="true"></div>
      </div>
      <div class="durations" id="gate-summary"></div>`;
    const canvases = this.root.querySelectorAll("canvas");
    this.gateCanvas = canvases[0];
    this.versionCanvas = canvases[1];
    this.axis = this.root.querySelector<HTMLElement>(".axis")!;
    this.summary = this.root.querySelector<HTMLElement>("#gate-summary")!;
    this.gateCanvas.addEventListener("mousemove", (e) => this.hover(e));
    const repaint = () => { this.palette = undefined; this.flush(true); };
    document.addEventListener("themechange", repaint);
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", repaint);
    new ResizeObserver(() => this.flush(true)).observe(this.root);
  }

  private colors(): Record<string, string> {
    if (!this.palette) {
      const css = getComputedStyle(document.documentElement);
      const v = (n: string) => css.getPropertyValue(n).trim();
      this.palette = { open: v("--g-open"), sealed: v("--g-sealed"), draining: v("--g-draining"), installing: v("--g-installing"),
        poisoned: v("--g-poisoned"), accent: v("--accent"), bg: v("--surface"), text: v("--text"), muted: v("--muted") };
    }
    return this.palette;
  }

  /** A tooltip naming the gate state and its duration under the pointer. */
  private hover(e: MouseEvent): void {
    if (this.start === null) return;
    const canvas = e.target as HTMLCanvasElement;
    const now = this.end ?? Date.now() / 1000;
    const t = this.start + (e.offsetX / canvas.clientWidth) * (now - this.start);
    let i = this.gates.length - 1;
    while (i > 0 && this.gates[i].ts > t) i--;
    const g = this.gates[i];
    if (!g) return;
    const until = i + 1 < this.gates.length ? this.gates[i + 1].ts : now;
    canvas.title = `${g.value} for ${ms((until - g.ts) * 1000)} from ${timeOfDay(g.ts)}`;
  }
}
