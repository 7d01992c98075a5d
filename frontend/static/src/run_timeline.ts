/** Gate timeline (open, sealed, draining, installing, poisoned, with durations) drawn on the same time axis
 * as the weight-version timeline, so a publication lines up with the gate window that produced it. */
import { esc, ms, num, timeOfDay } from "./lib/format";
import type { RunEvent } from "./lib/model";

interface Mark { ts: number; value: string }
const STATES = ["open", "sealed", "draining", "installing", "poisoned"];
const MAX_SEGMENTS = 600; // past this, neighbours of the same state are merged so the DOM stays small

function tsOf(ev: RunEvent): number {
  return typeof ev.ts === "number" ? ev.ts : Date.parse(String(ev.ts)) / 1000;
}

export class Timeline {
  gates: Mark[] = [];
  versions: { ts: number; version: number; pauseMs: number | null }[] = [];
  start: number | null = null;
  end: number | null = null; // set when the run is finished; otherwise the lanes extend to now
  private dirty = false;

  constructor(private root: HTMLElement) {}

  add(ev: RunEvent): boolean {
    const ts = tsOf(ev);
    if (this.start === null || ts < this.start) this.start = ts;
    if (ev.type === "gate" && typeof ev.data?.state === "string") {
      const last = this.gates[this.gates.length - 1];
      if (!last || last.value !== ev.data.state) this.gates.push({ ts, value: ev.data.state });
      this.dirty = true;
      return true;
    }
    if (ev.type === "version" && typeof ev.data?.version === "number") {
      const published = typeof ev.data.published_at === "number" ? ev.data.published_at : ts;
      this.versions.push({ ts: published, version: ev.data.version, pauseMs: typeof ev.data.pause_ms === "number" ? ev.data.pause_ms : null });
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

  flush(force = false): void {
    if (!this.dirty && !force) return;
    this.dirty = false;
    if (this.start === null || (!this.gates.length && !this.versions.length)) {
      this.root.innerHTML = `<p class="empty">No gate or weight-version events yet.</p>`;
      return;
    }
    const now = this.end ?? Date.now() / 1000;
    const t0 = this.start, span = Math.max(1e-3, now - t0);
    const pct = (t: number) => ((Math.max(t0, Math.min(now, t)) - t0) / span) * 100;

    let gates = this.gates;
    if (gates.length > MAX_SEGMENTS) {
      // Keep every poisoned stretch visible; thin the rest evenly.
      const stride = Math.ceil(gates.length / MAX_SEGMENTS);
      gates = gates.filter((g, i) => i % stride === 0 || g.value === "poisoned");
    }
    const gateSegs = gates.map((g, i) => {
      const until = i + 1 < gates.length ? gates[i + 1].ts : now;
      const left = pct(g.ts), width = Math.max(0.15, pct(until) - left);
      return `<div class="seg ${esc(g.value)}" style="left:${left.toFixed(3)}%;width:${width.toFixed(3)}%" title="${esc(g.value)} for ${ms((until - g.ts) * 1000)} from ${timeOfDay(g.ts)}"></div>`;
    }).join("");

    const vs = this.versions.length > MAX_SEGMENTS ? this.versions.filter((_, i, a) => i % Math.ceil(a.length / MAX_SEGMENTS) === 0) : this.versions;
    const verSegs = vs.map((v, i) => {
      const until = i + 1 < vs.length ? vs[i + 1].ts : now;
      const left = pct(v.ts), width = Math.max(0.15, pct(until) - left);
      const shade = 0.18 + 0.5 * ((i % 2) ? 0.35 : 0.7);
      return `<div class="seg ver" style="left:${left.toFixed(3)}%;width:${width.toFixed(3)}%;--shade:${shade.toFixed(2)}" title="weights v${v.version} from ${timeOfDay(v.ts)}${v.pauseMs !== null ? `, generation paused ${ms(v.pauseMs)}` : ""}">v${v.version}</div>`;
    }).join("");

    const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => `<span style="left:${(f * 100).toFixed(1)}%">${f === 0 ? timeOfDay(t0).slice(0, 8) : `+${ms(f * span * 1000)}`}</span>`).join("");
    const totals = this.totals(now);
    const pauses = this.versions.map((v) => v.pauseMs).filter((p): p is number => p !== null);
    const meanPause = pauses.length ? pauses.reduce((a, b) => a + b, 0) / pauses.length : null;
    const latest = this.gates[this.gates.length - 1]?.value ?? "none";
    const lastVersion = this.versions[this.versions.length - 1]?.version;

    this.root.innerHTML = `
      <div class="timeline">
        <div class="lane-label" id="lane-gate">Gate</div>
        <div class="lane" role="img" aria-labelledby="lane-gate" aria-describedby="gate-summary" data-testid="gate-lane" data-segments="${this.gates.length}">${gateSegs}</div>
        <div class="lane-label" id="lane-ver">Weights</div>
        <div class="lane" role="img" aria-labelledby="lane-ver" aria-describedby="gate-summary" data-testid="version-lane" data-segments="${this.versions.length}">${verSegs}</div>
        <div></div><div class="axis" aria-hidden="true">${ticks}</div>
      </div>
      <div class="durations" id="gate-summary">
        <span>Now <b>${esc(latest)}</b></span>
        ${STATES.map((s) => `<span><span class="sw" style="display:inline-block;width:.7rem;height:.7rem;border-radius:3px;background:var(--g-${s});vertical-align:-1px"></span> ${s} <b>${ms((totals[s] ?? 0) * 1000)}</b></span>`).join("")}
        <span>${this.versions.length} publications${lastVersion !== undefined ? `, latest <b>v${lastVersion}</b>` : ""}${meanPause !== null ? `, mean pause <b>${num(meanPause)} ms</b>` : ""}</span>
      </div>`;
  }
}
