/** The run's event log: every event kept in memory (bounded), filtered by type and text, newest first.
 * `status` rows are the platform's moves of the run, one per move; `job_status` rows are the job's own reports
 * of its state (its error, its final metrics, that it saw a cancel), shown as their own type so a move never
 * reads twice, and hidden with their chip. */
import { esc, timeOfDay } from "./lib/format";
import type { StoredEvent as RunEvent } from "./lib/messages";

const TYPES = ["status", "job_status", "gate", "version", "sampler", "rollout", "train", "worker", "checkpoint", "log", "resources", "control", "agents", "preempt_requested", "preempted", "resumed"]; // sample events go to the inspector (their own table), never to the log
const KEEP = 20_000; // events held for filtering; older ones are still in the database / REST API
const SHOW = 300; // rows rendered at once
const EMPTY = `<tr><td colspan="4" class="muted">No events match.</td></tr>`;

export class EventLog {
  private events: { ev: RunEvent; text: string; hay: string }[] = [];
  private hidden = new Set<string>();
  private query = "";
  dirty = false;
  private full = true; // next flush redraws everything (first draw, filter change, eviction)
  private drawnUpTo = 0; // events[0..drawnUpTo) are reflected in the table and the counts
  private matched = 0;
  private shown = 0;
  private body: HTMLElement;
  private count: HTMLElement;
  private olderNote: HTMLElement;
  private olderLoad: (() => Promise<void>) | null = null;

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
      <p class="muted" style="margin:.2rem 0 .5rem;font-size:.84rem" id="log-older" hidden><span></span>
        <button type="button" class="btn" id="log-older-btn">Load older events</button></p>
      <div class="log" tabindex="0" aria-labelledby="log-title"><table><thead><tr><th scope="col">seq</th><th scope="col">time</th><th scope="col">type</th><th scope="col">data</th></tr></thead><tbody id="log-body"></tbody></table></div>`;
    this.body = root.querySelector("#log-body")!;
    this.count = root.querySelector("#log-count")!;
    this.olderNote = root.querySelector("#log-older")!;
    root.querySelector<HTMLButtonElement>("#log-older-btn")!.addEventListener("click", async (e) => {
      const button = e.currentTarget as HTMLButtonElement;
      if (!this.olderLoad) return;
      button.disabled = true;
      try { await this.olderLoad(); } finally { button.disabled = false; }
    });
    root.querySelectorAll<HTMLInputElement>(".filters input").forEach((box) => box.addEventListener("change", () => {
      if (box.checked) this.hidden.delete(box.value); else this.hidden.add(box.value);
      this.full = true; this.flush();
    }));
    root.querySelector<HTMLInputElement>("#log-search")!.addEventListener("input", (e) => {
      this.query = (e.target as HTMLInputElement).value.trim().toLowerCase();
      this.full = true; this.flush();
    });
  }

  add(ev: RunEvent): void {
    let text = JSON.stringify(ev.data ?? {});
    if (text.length > 300) text = text.slice(0, 300) + "…";
    this.events.push({ ev, text, hay: `${ev.type} ${text}`.toLowerCase() });
    if (this.events.length > KEEP + 1000) {
      // Drop the oldest in chunks, then rebuild once (indices of what is drawn shift).
      this.events.splice(0, this.events.length - KEEP);
      this.full = true;
    }
    this.dirty = true;
  }

  /** The server streamed only the newest events (paged replay): events after+1..through are not here.
   * `page(after)` reads one page of stored events (GET /api/runs/<id>/events/?after=) on request. */
  older(after: number, through: number, page: (after: number) => Promise<RunEvent[]>): void {
    let from = after;
    const note = () => {
      this.olderNote.hidden = from >= through;
      this.olderNote.querySelector("span")!.textContent = `Events ${from + 1}–${through} were not streamed to this page. `;
    };
    this.olderLoad = async () => {
      const got: RunEvent[] = [];
      while (from < through) {
        const events = (await page(from)).filter((ev) => ev.seq > from && ev.seq <= through);
        if (!events.length) break;
        got.push(...events);
        from = events[events.length - 1].seq;
      }
      this.addOlder(got);
      note();
    };
    note();
  }

  private addOlder(events: RunEvent[]): void {
    const rows = events.map((ev) => {
      let text = JSON.stringify(ev.data ?? {});
      if (text.length > 300) text = text.slice(0, 300) + "…";
      return { ev, text, hay: `${ev.type} ${text}`.toLowerCase() };
    });
    const seen = new Set(this.events.map((e) => e.ev.seq));
    this.events = [...rows.filter((r) => !seen.has(r.ev.seq)), ...this.events].sort((a, b) => a.ev.seq - b.ev.seq);
    this.full = true;
    this.flush();
  }

  private matches(e: { ev: RunEvent; hay: string }): boolean {
    return !this.hidden.has(e.ev.type) && (!this.query || e.hay.includes(this.query));
  }

  private row(e: { ev: RunEvent; text: string }): string {
    const ts = typeof e.ev.ts === "number" ? e.ev.ts : Date.parse(String(e.ev.ts)) / 1000;
    return `<tr data-type="${esc(e.ev.type)}"><td class="num">${esc(e.ev.seq)}</td><td class="num">${timeOfDay(ts)}</td><td><span class="type-tag">${esc(e.ev.type)}</span></td><td class="data">${esc(e.text)}</td></tr>`;
  }

  /** New events are prepended to what is drawn; a filter change (or eviction) redraws from scratch. */
  flush(): void {
    if (!this.dirty && !this.full) return;
    this.dirty = false;
    if (this.full) {
      this.full = false;
      const rows: string[] = [];
      this.matched = 0;
      for (let i = this.events.length - 1; i >= 0; i--) {
        if (!this.matches(this.events[i])) continue;
        this.matched++;
        if (rows.length < SHOW) rows.push(this.row(this.events[i]));
      }
      this.body.innerHTML = rows.join("") || EMPTY;
      this.shown = Math.min(this.matched, SHOW);
    } else {
      const rows: string[] = [];
      for (let i = this.events.length - 1; i >= this.drawnUpTo; i--) {
        if (!this.matches(this.events[i])) continue;
        this.matched++;
        if (rows.length < SHOW) rows.push(this.row(this.events[i]));
      }
      if (rows.length) {
        if (!this.shown) this.body.innerHTML = "";
        this.body.insertAdjacentHTML("afterbegin", rows.join(""));
        this.shown += rows.length;
        while (this.shown > SHOW) { this.body.lastElementChild?.remove(); this.shown--; }
      }
    }
    this.drawnUpTo = this.events.length;
    this.count.textContent = `${this.matched} of ${this.events.length} events${this.matched > SHOW ? `, newest ${SHOW} shown` : ""}`;
  }
}
