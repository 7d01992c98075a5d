/** The run page's serving panel: in-flight requests per engine (gate events), per publication its drain time,
 * the requests its drain waited for and those admitted at its reopen, summed and per engine (version events), evictions, safe rejections and
 * rows per forward step (engine snapshots: how well an engine batches), aborted episodes per reason (rollout
 * events) and groups re-run after a checkpoint's quiesce (checkpoint events). Folded from the job's events only. */
import { esc, num } from "./lib/format";
import type { GateEngine, StoredEvent, VersionEngine } from "./lib/messages";

const show = (v: number | null | undefined, suffix = ""): string => (v == null ? `<span class="muted">—</span>` : `${num(v)}${suffix}`);

interface Publication {
  version: number; drainMs: number | null; pauseMs: number;
  drained: number | null; admitted: number | null; engines: VersionEngine[];
}

export class ServingPanel {
  private engines = new Map<string, GateEngine>();
  private publications: Publication[] = [];
  private aborted = 0;
  private abortedBy: Record<string, number> = {};
  private rebuffered = 0;
  private failedCheckpoints = 0;

  add(ev: StoredEvent): boolean {
    switch (ev.type) {
      case "gate":
        for (const e of ev.data.engines) if (e.engine != null) this.engines.set(e.engine, e);
        return true;
      case "version": {
        const d = ev.data;
        this.publications.push({
          version: d.version, drainMs: d.drain_ms ?? null, pauseMs: d.pause_ms,
          drained: d.drained ?? null, admitted: d.admitted_at_reopen ?? null, engines: d.engines ?? [],
        });
        if (this.publications.length > 200) this.publications.shift();
        return true;
      }
      case "rollout":
        this.aborted += ev.data.aborted ?? 0;
        if (ev.data.aborted_by) this.abortedBy = { ...ev.data.aborted_by };
        return true;
      case "checkpoint":
        this.rebuffered += ev.data.rebuffered ?? 0;
        if (ev.data.state === "failed") this.failedCheckpoints += 1;
        return true;
    }
    return false;
  }

  render(root: HTMLElement): void {
    const engines = [...this.engines.values()];
    const sum = (key: "evictions" | "rejections"): number | null => {
      const values = engines.map((e) => e[key]).filter((v): v is number => v != null);
      return values.length ? values.reduce((a, b) => a + b, 0) : null;
    };
    const inflight = (e: GateEngine): number | null => e.inflight ?? e.active ?? null;
    // Rows a forward step advanced on average since the engine started: a step's cost is mostly fixed on a small
    // policy, so fewer rows per step (requests reaching the engine one at a time) cost more per token.
    const rowsPerStep = (e: GateEngine): number | null =>
      e.steps && e.rows_stepped != null ? e.rows_stepped / e.steps : null;
    const drains = this.publications.map((p) => p.drainMs).filter((v): v is number => v !== null);
    const reasons = Object.entries(this.abortedBy);
    const stat = (label: string, value: string, testid: string) =>
      `<div class="stat"><div class="l">${label}</div><div class="v num" data-testid="${testid}">${value}</div></div>`;
    const stats = [
      stat("In flight", show(engines.length ? engines.reduce((a, e) => a + (inflight(e) ?? 0), 0) : null), "serving-inflight"),
      stat("Evictions", show(sum("evictions")), "serving-evictions"),
      stat("Rejections", show(sum("rejections")), "serving-rejections"),
      stat("Aborted episodes", show(this.aborted), "serving-aborted"),
      stat("Last drain", show(drains.length ? drains[drains.length - 1] : null, " ms"), "serving-drain"),
    ].join("");
    const engineRows = engines.map((e) => `<tr data-engine="${esc(e.engine)}"><td>${esc(e.engine)}</td>
      <td class="num" data-testid="engine-inflight">${show(inflight(e))}</td><td class="num">${show(e.max_batch)}</td>
      <td class="num">${show(e.sessions)}${e.max_sessions != null ? ` / ${num(e.max_sessions)}` : ""}</td>
      <td class="num" data-testid="engine-evictions">${show(e.evictions)}</td><td class="num">${show(e.rejections)}</td>
      <td class="num" data-testid="engine-rows-per-step">${show(rowsPerStep(e))}</td></tr>`).join("");
    const engineTable = engines.length
      ? `<div class="table-wrap"><table aria-label="Requests per engine"><thead><tr><th scope="col">engine</th><th scope="col">in flight</th>
        <th scope="col">max batch</th><th scope="col">sessions</th><th scope="col">evictions</th><th scope="col">rejections</th>
        <th scope="col" title="rows a forward step advanced, on average since the engine started">rows / step</th></tr></thead>
        <tbody>${engineRows}</tbody></table></div>`
      : `<p class="empty">No engine reported yet.</p>`;
    const pubRows = this.publications.slice(-8).reverse().map((p) => `<tr><td class="num">v${esc(p.version)}</td>
      <td class="num" data-testid="publication-drain">${show(p.drainMs, " ms")}</td><td class="num">${show(p.pauseMs, " ms")}</td>
      <td class="num" data-testid="publication-drained">${show(p.drained)}</td>
      <td class="num" data-testid="publication-admitted">${show(p.admitted)}</td></tr>`).join("");
    const latest = this.publications[this.publications.length - 1];
    const perEngine = latest?.engines.length
      ? `<p class="muted" data-testid="publication-engines">v${esc(latest.version)} per engine (drained / admitted at reopen): ${
        latest.engines.map((e) => `${esc(e.engine)} ${show(e.drained)} / ${show(e.admitted_at_reopen)}`).join(" · ")}</p>`
      : "";
    const pubTable = this.publications.length
      ? `<div class="table-wrap"><table aria-label="Drain per publication"><thead><tr><th scope="col">version</th>
        <th scope="col">drain</th><th scope="col">gates closed</th><th scope="col">requests drained</th>
        <th scope="col">admitted at reopen</th></tr></thead><tbody>${pubRows}</tbody></table></div>${perEngine}`
      : `<p class="empty">No publication yet.</p>`;
    const why = reasons.length
      ? `<p class="muted" data-testid="serving-aborted-by">aborted since start: ${reasons.map(([k, v]) => `${esc(k.replace(/_/g, " "))} ${num(v)}`).join(" · ")}</p>`
      : "";
    const quiesce = this.rebuffered || this.failedCheckpoints
      ? `<p class="muted" data-testid="serving-quiesce">checkpoint quiesce: ${num(this.rebuffered)} group(s) re-run${
        this.failedCheckpoints ? ` · ${num(this.failedCheckpoints)} checkpoint(s) failed` : ""}</p>`
      : "";
    root.innerHTML = `<div class="stats">${stats}</div>${why}${quiesce}${engineTable}${pubTable}`;
  }
}
