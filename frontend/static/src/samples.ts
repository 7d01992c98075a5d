/** The sample inspector (/runs/<id>/samples/): the page's query string is the filter (a stable URL per
 * filter and per page), `?sample=<id>` names one expanded sample (a stable URL per sample), and
 * `?view=across&prompt_index=N` shows one prompt across steps. Reads GET /api/runs/<id>/samples/. */
import { api, ApiError, embedded, errorMessages } from "./lib/api";
import { el } from "./lib/dom";
import { num } from "./lib/format";
import { API_PARAMS, Sample, SamplePage } from "./lib/samples";
import { acrossView, sampleDetail, versionLegend } from "./samples_view";

interface PageData { id: number; name: string }
const page = embedded<PageData>("samples-page")!;
const runId = Number(page.id);
const params = new URLSearchParams(location.search);
const form = document.getElementById("sample-filters") as HTMLFormElement;
const body = document.getElementById("samples-body")!;
const errorBox = document.getElementById("samples-error")!;
let rows: Sample[] = [];

function pageUrl(changes: Record<string, string | null>): string {
  const next = new URLSearchParams(params);
  for (const [k, v] of Object.entries(changes)) if (v === null || v === "") next.delete(k); else next.set(k, v);
  const q = next.toString();
  return `${location.pathname}${q ? `?${q}` : ""}`;
}

function apiQuery(): string {
  const q = new URLSearchParams();
  for (const name of API_PARAMS) { const v = params.get(name); if (v) q.set(name, v); }
  return q.toString();
}

function showError(err: unknown): void {
  errorBox.hidden = false;
  errorBox.textContent = err instanceof ApiError ? errorMessages(err.body).join("; ") || err.message : String(err);
}

function acrossHref(s: Sample): string {
  return `${location.pathname}?${new URLSearchParams({ prompt_index: String(s.prompt_index), ordering: "step", limit: "200", view: "across" })}`;
}

async function detail(id: number): Promise<Sample> {
  return api<Sample>("GET", `/api/runs/${runId}/samples/${id}/`);
}

/** Click on a row: expand it under the row (collapse it on a second click); the URL names the sample. */
async function toggle(tr: HTMLTableRowElement, s: Sample): Promise<void> {
  const open = tr.nextElementSibling as HTMLElement | null;
  if (open?.classList.contains("sample-expanded")) {
    open.remove(); tr.setAttribute("aria-expanded", "false");
    history.replaceState(null, "", pageUrl({ sample: null }));
    return;
  }
  tr.setAttribute("aria-expanded", "true");
  const full = await detail(s.id);
  tr.after(el("tr", { class: "sample-expanded" }, el("td", { colspan: "11" }, sampleDetail(full, acrossHref(full)))));
  params.set("sample", String(s.id));
  history.replaceState(null, "", pageUrl({}));
}

function row(s: Sample): HTMLTableRowElement {
  const tr = el("tr", { class: "sample-row", tabindex: "0", "aria-expanded": "false", "data-id": String(s.id), "data-step": String(s.step) },
    el("td", { class: "num" }, String(s.id)), el("td", { class: "num" }, String(s.step)),
    el("td", { class: "num" }, `${s.group}/${s.index}`), el("td", { class: "num" }, num(s.reward)),
    el("td", { class: "num" }, num(s.advantage)), el("td", { class: "num" }, String(s.staleness)),
    el("td", {}, el("span", { class: `finish finish-${s.finish_reason}` }, s.finish_reason)), el("td", {}, s.engine),
    el("td", { class: "num" }, String(s.length)), el("td", { class: "text" }, el("code", {}, s.prompt)),
    el("td", { class: "text" }, el("code", {}, s.completion)));
  const open = () => { toggle(tr, s).catch(showError); };
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
  return tr;
}

function cursorOf(link: string | null): string | null {
  return link ? new URL(link, location.origin).searchParams.get("cursor") : null;
}

function pager(id: string, link: string | null): void {
  const a = document.getElementById(id) as HTMLAnchorElement;
  const cursor = cursorOf(link);
  a.hidden = cursor === null;
  if (cursor !== null) a.href = pageUrl({ cursor, sample: null });
}

async function load(): Promise<void> {
  const data = await api<SamplePage>("GET", `/api/runs/${runId}/samples/?${apiQuery()}`);
  rows = data.results;
  body.replaceChildren(...(rows.length ? rows.map(row) : [el("tr", {}, el("td", { colspan: "11", class: "muted" }, "No samples match."))]));
  document.getElementById("samples-count")!.textContent = `${rows.length} shown${data.next ? ", more on the next page" : ""}`;
  pager("page-next", data.next);
  pager("page-prev", data.previous);
  if (params.get("view") === "across") {
    const across = document.getElementById("across")!;
    across.hidden = false;
    across.replaceChildren(acrossView(rows));
    document.getElementById("samples-table-wrap")!.hidden = true;
  }
}

async function focusSample(id: number): Promise<void> {
  const s = await detail(id);
  document.getElementById("sample-focus")!.hidden = false;
  document.getElementById("focus-title")!.textContent = `Sample ${s.id} (step ${s.step})`;
  document.getElementById("focus-body")!.replaceChildren(sampleDetail(s, acrossHref(s)));
}

function fillForm(): void {
  for (const input of Array.from(form.elements) as (HTMLInputElement | HTMLSelectElement)[]) {
    const v = input.name ? params.get(input.name) : null;
    if (v !== null) input.value = v;
  }
}

form.addEventListener("submit", (e) => {
  e.preventDefault();
  const q = new URLSearchParams();
  for (const [k, v] of new FormData(form).entries()) if (typeof v === "string" && v.trim() && !(k === "ordering" && v === "-id")) q.set(k, v.trim());
  location.assign(`${location.pathname}${q.toString() ? `?${q}` : ""}`);
});

function topK(id: string, ordering: string): void {
  document.getElementById(id)!.addEventListener("click", (e) => {
    e.preventDefault();
    const k = (document.getElementById("topk-k") as HTMLInputElement).value.trim() || "5";
    const step = params.get("step") || (rows[0] ? String(rows[0].step) : "");
    const q = new URLSearchParams({ ...(step ? { step } : {}), ordering, limit: k });
    location.assign(`${location.pathname}?${q}`);
  });
}

fillForm();
topK("topk-best", "-reward");
topK("topk-worst", "reward");
document.getElementById("version-legend")!.replaceChildren(versionLegend());
const focused = Number(params.get("sample"));
if (Number.isSafeInteger(focused) && focused > 0) focusSample(focused).catch(showError);
load().catch(showError);
