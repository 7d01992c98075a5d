/** The run's event log: every event kept in memory (bounded), filtered by type and text, newest first. */
import { esc, timeOfDay } from "./lib/format";
import type { RunEvent } from "./lib/model";

const TYPES = ["status", "gate", "version", "sampler", "rollout", "train", "worker", "checkpoint", "log"];
const KEEP = 20_000; // events held for filtering; older ones are still in the database / REST API
const SHOW = 300; // rows rendered at once

export class EventLog {
  private events: { ev: RunEvent; text: string; hay: string }[] = [];
  private hidden = new Set<string>();
  private query = "";
  private dirty = false;
  private body: HTMLElement;
  private count: HTMLElement;

  constructor(root: HTMLElement) {
    root.innerHTML = `
      <div class="section-head"><h2 id="log-title">Event log</h2>
        <div class="tools">
          <div class="filters" role="group" aria-label="Show event types">
            ${TYPES.map((t) => `<label class="chip"><input type="checkbox" checked value="${t}" aria-label="Show ${t} events"> ${t}</label>`).join("")}
          </div>
          <input type="search" id="log-search" placeholder="Filter text…" aria-label="Filter events by text">
        </div></div>
      <p class="muted" style="margin:.2rem 0 .5rem;font-size:.84rem" id="log-count" aria-live="polite"></p>
      <div class="log" tabindex="0" aria-labelledby="log-title"><table><thead><tr><th scope="col">seq</th><th scope="col">time</th><th scope="col">type</th><th scope="col">data</th></tr></thead><tbody id="log-body"></tbody></table></div>`;
    this.body = root.querySelector("#log-body")!;
    this.count = root.querySelector("#log-count")!;
    root.querySelectorAll<HTMLInputElement>(".filters input").forEach((box) => box.addEventListener("change", () => {
      if (box.checked) this.hidden.delete(box.value); else this.hidden.add(box.value);
      this.dirty = true; this.flush();
    }));
    root.querySelector<HTMLInputElement>("#log-search")!.addEventListener("input", (e) => {
      this.query = (e.target as HTMLInputElement).value.trim().toLowerCase();
      this.dirty = true; this.flush();
    });
  }

  add(ev: RunEvent): void {
    const text = JSON.stringify(ev.data ?? {});
    this.events.push({ ev, text, hay: `${ev.type} ${text}`.toLowerCase() });
    if (this.events.length > KEEP) this.events.splice(0, this.events.length - KEEP);
    this.dirty = true;
  }

  flush(): void {
    if (!this.dirty) return;
    this.dirty = false;
    const rows: string[] = [];
    let matched = 0;
    for (let i = this.events.length - 1; i >= 0; i--) {
      const { ev, text, hay } = this.events[i];
      if (this.hidden.has(ev.type)) continue;
      if (this.query && !hay.includes(this.query)) continue;
      matched++;
      if (rows.length < SHOW) {
        const ts = typeof ev.ts === "number" ? ev.ts : Date.parse(String(ev.ts)) / 1000;
        rows.push(`<tr data-type="${esc(ev.type)}"><td class="num">${ev.seq}</td><td class="num">${timeOfDay(ts)}</td><td><span class="type-tag">${esc(ev.type)}</span></td><td class="data">${esc(text.length > 400 ? text.slice(0, 400) + "…" : text)}</td></tr>`);
      }
    }
    this.body.innerHTML = rows.join("") || `<tr><td colspan="4" class="muted">No events match.</td></tr>`;
    this.count.textContent = `${matched} of ${this.events.length} events${matched > SHOW ? `, newest ${SHOW} shown` : ""}`;
  }
}
