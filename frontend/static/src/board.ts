/** Queue board: slots per class with the reserve and borrowable share drawn, the waiting line in grant order,
 * the running runs with gate, version, sampler progress and reward; live over /ws/dashboard/. */
import { api, embedded } from "./lib/api";
import { CLASSES, CLASS_LABEL, detailText, duration, esc, eta, num, priorityText, reasonText, resText, runHref } from "./lib/format";
import type { PriorityFactors } from "./lib/format";
import { LiveSocket, wsUrl } from "./lib/live";
import { ACTIVE, FINISHED, positions, runView } from "./lib/model";
import { sparkline } from "./lib/sparkline";
import { applyDashboardMessage, BoardState, DashboardMsg } from "./board_state";
import type { BoardRun, DashboardSnapshotMsg, SlotsJson } from "./lib/messages";

performance.mark("board-start");
const MAX_CELLS = 64; // beyond this many slots the capacity bar draws proportional spans instead of cells

const initial = embedded<DashboardSnapshotMsg>("board-data");
const state: BoardState = { slots: null, queued: [], running: [], cluster: null };
if (initial) applyDashboardMessage(state, initial, FINISHED);
const rewardHistory = new Map<number, number[]>();
const highlight = Number(new URLSearchParams(location.search).get("submitted")) || null;
let lastQueueKey = "";
let frame = 0;

function renderCapacity(slots: SlotsJson | null): void {
  const el = document.getElementById("capacity")!;
  if (!slots) { el.innerHTML = `<p class="empty">Slot information is not available yet.</p>`; return; }
  const total = slots.total.max_total;
  const reserve = slots.policy.interactive_reserve;
  const borrowable = slots.borrowable;
  // Non-interactive runs fill from the left (they may only use the borrowable share); interactive runs fill
  // after them and are the only ones that can reach into the reserve.
  const used: string[] = [];
  for (const c of ["system", "schedule", "app", "interactive"]) {
    for (let i = 0; i < (slots.classes[c]?.running ?? 0); i++) used.push(c);
  }
  const waiting = CLASSES.reduce((a, c) => a + (slots.classes[c]?.waiting ?? 0), 0);
  let bar = "";
  if (total <= MAX_CELLS) {
    for (let i = 0; i < total; i++) {
      const cls = used[i];
      const inReserve = i >= total - reserve;
      bar += `<div class="cap-cell${cls ? ` used cls-${cls}` : ""}${inReserve ? " reserve" : ""}" title="${cls ? `${CLASS_LABEL[cls]} run` : "Free"}${inReserve ? " · interactive reserve" : ""}"></div>`;
    }
  } else {
    const pct = (n: number) => `${((n / total) * 100).toFixed(3)}%`;
    const counts = new Map<string, number>();
    for (const c of used) counts.set(c, (counts.get(c) ?? 0) + 1);
    for (const [c, n] of counts) bar += `<div class="cap-cell used cls-${c}" style="flex:0 0 ${pct(n)}" title="${n} ${CLASS_LABEL[c]} runs"></div>`;
    const free = Math.max(0, total - used.length);
    const freeBorrow = Math.max(0, Math.min(free, borrowable - used.length));
    if (freeBorrow) bar += `<div class="cap-cell" style="flex:0 0 ${pct(freeBorrow)}" title="${freeBorrow} free"></div>`;
    if (free - freeBorrow) bar += `<div class="cap-cell reserve" style="flex:0 0 ${pct(free - freeBorrow)}" title="${free - freeBorrow} free, interactive reserve"></div>`;
  }
  const span = (cls: string, n: number, text: string) => (n > 0 ? `<div class="cap-span ${cls}" style="flex:${n} 1 0">${text}</div>` : "");
  el.innerHTML = `
    <div class="kpis">
      <div class="kpi"><div class="v num" data-testid="total-running">${slots.total.running} / ${total}</div><div class="l">slots in use</div></div>
      <div class="kpi"><div class="v num">${waiting}</div><div class="l">waiting</div></div>
      <div class="kpi"><div class="v num" data-testid="reserve">${reserve}</div><div class="l">interactive reserve</div></div>
      <div class="kpi"><div class="v num" data-testid="borrowable">${borrowable}</div><div class="l">borrowable by other classes</div></div>
    </div>
    <div role="img" aria-label="${slots.total.running} of ${total} slots in use; ${reserve} reserved for interactive runs; other classes may borrow up to ${borrowable}">
      <div class="cap-bar">${bar}</div>
      <div class="cap-spans" aria-hidden="true">${span("borrow", borrowable, `borrowable · ${borrowable}`)}${span("reserve", reserve, `reserve · ${reserve}`)}</div>
    </div>
    <div class="legend" aria-hidden="true">
      ${CLASSES.map((c) => `<span class="cls-${c}"><span class="sw"></span>${CLASS_LABEL[c]}</span>`).join("")}
      <span><span class="sw res"></span>Interactive reserve (free)</span>
    </div>
    ${clusterHtml()}`;
}

/** Cluster capacity as admission sees it: alive nodes, their total and what the held runs leave free. */
function clusterHtml(): string {
  const c = state.cluster;
  if (!c) return "";
  if (!c.nodes) {
    return `<p class="muted" data-testid="cluster" data-nodes="0">Cluster capacity not known yet: runs wait until the platform has read the Ray cluster.</p>`;
  }
  return `<p data-testid="cluster" data-nodes="${esc(c.nodes)}" style="margin:.6rem 0 0">Cluster${c.reachable ? "" : ` <span class="badge st-failed">unreachable</span>`}:
    <span class="num">${esc(c.nodes)}</span> node${c.nodes === 1 ? "" : "s"};
    free <strong class="num" data-testid="cluster-free">${esc(resText(c.free))}</strong>
    of <span class="num" data-testid="cluster-total">${esc(resText(c.total))}</span></p>`;
}

/** The banner of an unreachable Ray cluster: runs wait (none is failed for it) until Ray answers again. */
function renderCluster(state: BoardState): void {
  const el = document.getElementById("cluster-banner")!;
  el.hidden = !state.cluster || state.cluster.reachable;
}

function renderClasses(slots: SlotsJson | null): void {
  const el = document.getElementById("classes")!;
  if (!slots) { el.innerHTML = ""; return; }
  el.innerHTML = CLASSES.map((c) => {
    const s = slots.classes[c] ?? { running: 0, waiting: 0, limit: 0, priority: 0, gpu_limit: null, gpus: 0 };
    const gpus = s.gpu_limit != null || s.gpus ? `<div class="muted num" data-testid="gpus-${c}" style="font-size:.8rem">${+s.gpus.toFixed(3)} GPU${s.gpu_limit != null ? ` of ${s.gpu_limit} (GPU limit)` : ""}</div>` : "";
    const pct = s.limit ? Math.min(100, (s.running / s.limit) * 100) : 0;
    return `<section class="class-card cls-${c}" aria-label="${CLASS_LABEL[c]} class" data-class="${c}">
      <div class="row"><span class="cls cls-${c}">${CLASS_LABEL[c]}</span><span class="muted">priority ${s.priority}</span></div>
      <div class="row"><span class="big num"><span data-testid="running-${c}">${s.running}</span> <span class="muted" style="font-size:.95rem">/ <span data-testid="limit-${c}">${s.limit}</span></span></span>
        <span class="num">${s.waiting} waiting</span></div>
      <div class="meter" role="meter" aria-label="${CLASS_LABEL[c]} running of limit" aria-valuemin="0" aria-valuemax="${s.limit}" aria-valuenow="${s.running}"><span style="width:${pct}%"></span></div>
      ${gpus}
    </section>`;
  }).join("");
}

function progress(run: BoardRun): string {
  const v = runView(run.summary);
  if (v.datasetSize === null || v.consumed === null) return `<span class="muted">—</span>`;
  const pct = v.datasetSize ? Math.min(100, (v.consumed / v.datasetSize) * 100) : 0;
  return `<div class="progress" role="progressbar" aria-label="Sampler progress of ${esc(run.name)}" aria-valuemin="0" aria-valuemax="${esc(v.datasetSize)}" aria-valuenow="${esc(v.consumed)}">
    <div class="bar"><span style="width:${pct.toFixed(1)}%"></span></div>
    <div class="lbl num">epoch ${esc(v.epoch ?? 0)} · ${esc(v.consumed)} / ${esc(v.datasetSize)} groups</div></div>`;
}

/** A running run's steps done (percent) and predicted time to its finish (run JSON `progress`,
 * `eta_finish_seconds`). */
function finishText(run: BoardRun): string {
  if (run.progress === null || run.progress === undefined) return `<span class="muted">—</span>`;
  const pct = `${Math.round(run.progress * 100)}%`;
  const left = run.eta_finish_seconds === null || run.eta_finish_seconds === undefined ? "" : `<div class="muted" style="font-size:.8rem" data-testid="eta-finish">done in ${esc(eta(run.eta_finish_seconds))}</div>`;
  return `${esc(pct)}${left}`;
}

function renderRunning(runs: BoardRun[]): void {
  const el = document.getElementById("running")!;
  document.getElementById("running-count")!.textContent = String(runs.length);
  if (!runs.length) { el.innerHTML = `<p class="empty">No run is running.</p>`; return; }
  const rows = runs.map((r) => {
    const v = runView(r.summary);
    const hist = rewardHistory.get(r.id) ?? [];
    return `<tr data-run="${esc(r.id)}" data-status="${esc(r.status)}"${r.id === highlight ? ' class="flash"' : ""}>
      <td><a class="run-link" href="${runHref(r.id)}">${esc(r.name)}</a><div class="muted num" style="font-size:.8rem">#${esc(r.id)} · ${esc(r.owner)}</div></td>
      <td><span class="cls cls-${esc(r.run_class)}">${esc(CLASS_LABEL[r.run_class] ?? r.run_class)}</span></td>
      <td><span class="badge st-${esc(r.status)}" data-testid="status">${esc(r.status)}</span>${r.pending_reason ? `<div class="muted" style="font-size:.8rem" data-testid="status-reason">${esc(reasonText(r.pending_reason))}</div>` : ""}${r.preempt_state === "requested" ? `<div class="muted" style="font-size:.8rem" data-testid="preempt" title="${esc(r.preempt_reason ?? "")}">preempted for #${esc(r.preempted_by ?? "?")}: checkpointing</div>` : r.preempt_state === "resumed" ? `<div class="muted" style="font-size:.8rem" data-testid="preempt">resumed after preemption</div>` : ""}</td>
      <td>${v.gateState ? `<span class="badge gate-${esc(v.gateState)}" title="gate state">${esc(v.gateState)}</span>` : `<span class="muted">—</span>`}</td>
      <td class="num" data-testid="version">${v.version === null ? "—" : `v${esc(v.version)}`}</td>
      <td>${progress(r)}</td>
      <td class="num" data-testid="run-progress">${finishText(r)}</td>
      <td class="hide-sm">${sparkline(hist, `Reward of ${r.name}`)}</td>
      <td class="num right">${num(v.reward)}</td>
    </tr>`;
  }).join("");
  el.innerHTML = `<div class="table-wrap"><table aria-describedby="running-title"><thead><tr><th scope="col">Run</th><th scope="col">Class</th><th scope="col">Status</th><th scope="col">Gate</th><th scope="col">Weights</th><th scope="col">Sampler</th><th scope="col">Progress</th><th scope="col" class="hide-sm">Reward trend</th><th scope="col" class="right">Reward</th></tr></thead><tbody>${rows}</tbody></table></div>`;
}

// The waiting line draws its head and grows on demand: laying out a 1,000-row table costs far more than
// building it, and nobody reads row 900 before row 100. The counts and positions are always complete.
const WAITING_PAGE = 100;
let waitingShown = WAITING_PAGE;
let waitingRuns: BoardRun[] = [];

function waitingRow(r: BoardRun, now: number): string {
  const p = positions(r);
  const waited = r.created_at ? now - Date.parse(r.created_at) / 1000 : r.queued_seconds ?? null;
  return `<tr data-run="${esc(r.id)}" data-status="${esc(r.status)}"${r.id === highlight ? ' class="flash"' : ""}>
    <td class="num" data-testid="position">${esc(p.overall ?? "—")}</td>
    <td><a class="run-link" href="${runHref(r.id)}">${esc(r.name)}</a><div class="muted num" style="font-size:.8rem">#${esc(r.id)} · ${esc(r.owner)}</div></td>
    <td><span class="cls cls-${esc(r.run_class)}">${esc(CLASS_LABEL[r.run_class] ?? r.run_class)}</span>${p.inClass ? `<div class="muted num" style="font-size:.8rem">#${esc(p.inClass)} in class</div>` : ""}</td>
    <td class="reason" data-testid="reason">${esc(reasonText(r.pending_reason))}${r.pending_detail ? `<div class="muted" style="font-size:.8rem" data-testid="reason-detail">${esc(detailText(r.pending_detail))}</div>` : ""}</td>
    <td class="num">${duration(waited)}</td>
    <td class="num" data-testid="eta">${eta(r.eta_seconds)}</td>
  </tr>`;
}

function renderWaiting(runs: BoardRun[], force = false): void {
  const key = runs.map((r) => `${r.id}:${r.status}:${JSON.stringify(r.position)}:${r.pending_reason}:${JSON.stringify(r.pending_detail)}:${r.eta_seconds}`).join("|");
  if (key === lastQueueKey && !force) return;
  lastQueueKey = key;
  waitingRuns = runs;
  const el = document.getElementById("waiting")!;
  document.getElementById("waiting-count")!.textContent = String(runs.length);
  if (!runs.length) { el.innerHTML = `<p class="empty">Nobody is waiting: new runs start at once.</p>`; return; }
  const now = Date.now() / 1000;
  const shown = runs.slice(0, waitingShown);
  const rest = runs.length - shown.length;
  el.innerHTML = `<div class="table-wrap"><table class="waiting-table"><thead><tr><th scope="col">#</th><th scope="col">Run</th><th scope="col">Class</th><th scope="col">Why it waits</th><th scope="col">Waited</th><th scope="col">Starts in</th></tr></thead>
    <tbody>${shown.map((r) => waitingRow(r, now)).join("")}</tbody></table></div>
    ${rest > 0 ? `<div class="more" id="waiting-more"><span class="muted">Showing ${shown.length} of ${runs.length}.</span>
      <button type="button" class="btn" id="waiting-more-btn">Show ${Math.min(rest, WAITING_PAGE)} more</button>
      <button type="button" class="btn btn-ghost" id="waiting-all-btn">Show all</button></div>` : ""}`;
  if (rest > 0) {
    document.getElementById("waiting-more-btn")!.addEventListener("click", () => { waitingShown += WAITING_PAGE; renderWaiting(waitingRuns, true); });
    document.getElementById("waiting-all-btn")!.addEventListener("click", () => { waitingShown = Infinity; renderWaiting(waitingRuns, true); });
    // Scrolling to the end of the drawn rows draws the next page, as if the list were all there.
    moreObserver.observe(document.getElementById("waiting-more")!);
  }
}

// Hovering a waiting row shows what places it in the line (GET /api/runs/<id>/priority/: class priority, aging,
// max wait, fair share, per-user limit) as the row's title, set as text; fetched at most every 10 s per row.
const priorityAsked = new Map<number, number>();
document.getElementById("waiting")!.addEventListener("mouseover", (ev) => {
  const row = (ev.target as HTMLElement).closest<HTMLTableRowElement>("tr[data-run]");
  const id = Number(row?.dataset.run);
  if (!row || !id || Date.now() - (priorityAsked.get(id) ?? 0) < 10_000) return;
  priorityAsked.set(id, Date.now());
  api<{ factors: PriorityFactors | null }>("GET", `/api/runs/${id}/priority/`)
    .then((p) => { row.title = priorityText(p.factors); })
    .catch(() => { row.title = "Priority factors are visible to the run's owner and staff"; });
});

const moreObserver = new IntersectionObserver((entries) => {
  if (!entries.some((e) => e.isIntersecting)) return;
  moreObserver.disconnect();
  waitingShown += WAITING_PAGE;
  renderWaiting(waitingRuns, true);
}, { rootMargin: "400px" });

function byPosition(a: BoardRun, b: BoardRun): number {
  const pa = positions(a).overall ?? 1e9, pb = positions(b).overall ?? 1e9;
  return pa - pb || a.id - b.id;
}

function render(): void {
  frame = 0;
  state.queued = state.queued.filter((r) => r.status === "queued").sort(byPosition);
  state.running = state.running.filter((r) => ACTIVE.has(r.status)).sort((a, b) => a.id - b.id);
  for (const r of state.running) {
    const v = runView(r.summary);
    // Server history seeds the line once (an active row's `reward_history`); after that each update's latest
    // reward extends it.
    if (!rewardHistory.has(r.id)) rewardHistory.set(r.id, (r.reward_history ?? []).slice(-60));
    if (v.reward === null) continue;
    const hist = rewardHistory.get(r.id)!;
    if (hist[hist.length - 1] !== v.reward) { hist.push(v.reward); if (hist.length > 60) hist.shift(); }
    rewardHistory.set(r.id, hist);
  }
  renderCluster(state);
  renderCapacity(state.slots);
  renderClasses(state.slots);
  renderRunning(state.running);
  renderWaiting(state.queued);
}

function schedule(): void {
  if (!frame) frame = requestAnimationFrame(render);
}

render();
// Marked once the drawn board has been painted (the timeout runs after the frame the rAF belongs to).
requestAnimationFrame(() => setTimeout(() => performance.mark("board-rendered"), 0));
Object.assign(window, { __board: { state, rendered: true } }); // for tests

new LiveSocket<DashboardMsg>({
  url: () => wsUrl("/ws/dashboard/"),
  onMessage: (msg) => { if (applyDashboardMessage(state, msg, FINISHED)) schedule(); },
});
