/** Submit form for a training run (origin `dashboard`, so class interactive): fields come from the run kind's
 * JSON schema (rendered by the server), values are typed here, and the API's validation errors are shown
 * beside the field they name. */
import { api, ApiError } from "./lib/api";
import { esc, resText } from "./lib/format";

const form = document.getElementById("submit-form") as HTMLFormElement;
const alertBox = document.getElementById("form-error")!;
const button = form.querySelector<HTMLButtonElement>('button[type="submit"]')!;

function fieldEl(name: string): HTMLElement | null {
  return form.querySelector<HTMLElement>(`[data-field="${CSS.escape(name)}"]`);
}

function clearErrors(): void {
  form.querySelectorAll(".field.invalid").forEach((f) => f.classList.remove("invalid"));
  form.querySelectorAll<HTMLElement>(".field .error").forEach((e) => { e.textContent = ""; e.hidden = true; });
  form.querySelectorAll("[aria-invalid]").forEach((e) => e.removeAttribute("aria-invalid"));
  alertBox.hidden = true;
  alertBox.textContent = "";
}

/** Flatten a DRF error body into [path, message] pairs: {"config": {"lr": ["..."]}} -> ["config.lr", "..."]. */
function flatten(body: unknown, path = ""): [string, string][] {
  if (body === null || body === undefined) return [];
  // The platform's own shape: {"detail": "config.lr: ...", "field": "config.lr"}.
  const b = body as Record<string, unknown>;
  if (typeof b === "object" && b.errors && typeof b.errors === "object") return flatten(b.errors, path);
  if (typeof b === "object" && typeof b.detail === "string" && typeof b.field === "string") return [[b.field, b.detail]];
  if (typeof body === "string") return [[path, body]];
  if (Array.isArray(body)) return body.flatMap((b) => flatten(b, path));
  if (typeof body === "object") {
    return Object.entries(body as Record<string, unknown>).flatMap(([k, v]) =>
      flatten(v, ["detail", "non_field_errors", "message", "error"].includes(k) ? path : path ? `${path}.${k}` : k));
  }
  return [[path, String(body)]];
}

/** Which form field an error is about: its path (`config.lr`, `name`) or a `field: message` prefix. */
function fieldOf(path: string, message: string): string | null {
  const candidates = [path.replace(/^config\./, ""), path];
  const m = message.match(/^(?:config\.)?([A-Za-z_][\w]*)\s*:/);
  if (m) candidates.push(m[1]);
  for (const c of candidates) if (c && fieldEl(c)) return c;
  return null;
}

function showErrors(body: unknown, status: number): void {
  const formLevel: string[] = [];
  let first: HTMLElement | null = null;
  for (let [path, message] of flatten(body)) {
    const name = fieldOf(path, message);
    const field = name ? fieldEl(name) : null;
    // Form-level: e.g. a 429 naming the per-user cap (`max_queued_per_user: you have 20 queued runs, ...`).
    if (!field) { formLevel.push(path && path !== "config" && !message.startsWith(`${path}:`) ? `${path}: ${message}` : message); continue; }
    field.classList.add("invalid");
    const details = field.closest("details");
    if (details) details.open = true;
    // The API prefixes messages with the field path ("config.lr: lr: must be ..."); beside the field it is noise.
    message = message.replace(/^(?:config\.)?[\w.]+:\s*/, "").replace(/^[\w.]+:\s*/, "");
    const err = field.querySelector<HTMLElement>(".error")!;
    err.textContent = err.textContent ? `${err.textContent} ${message}` : message;
    err.hidden = false;
    const input = field.querySelector<HTMLElement>("input, select");
    input?.setAttribute("aria-invalid", "true");
    first ??= input;
  }
  if (formLevel.length || !first) {
    alertBox.textContent = formLevel.length ? formLevel.join(" ") : `The server refused the run (HTTP ${status}).`;
    alertBox.hidden = false;
    alertBox.focus();
  } else {
    first.focus();
  }
}

function valueOf(input: HTMLInputElement | HTMLSelectElement): unknown {
  const type = input.dataset.type;
  if (input instanceof HTMLInputElement && input.type === "checkbox") return input.checked;
  const raw = input.value.trim();
  if (type === "integer" || type === "number") {
    // Send what was typed when it is not a number, so the API names the field in its message.
    if (raw === "") return raw;
    const n = Number(raw);
    return isNaN(n) ? raw : n;
  }
  return input.value;
}

function configOf(): Record<string, unknown> {
  const config: Record<string, unknown> = {};
  form.querySelectorAll<HTMLInputElement | HTMLSelectElement>("[data-config]").forEach((input) => {
    config[input.name] = valueOf(input);
  });
  return config;
}

interface Demand {
  bundles: Record<string, unknown>[];
  total: Record<string, unknown>;
  strategy: string;
  fits: boolean;
  problem: string | null;
}

// The run's demand as the server derives it (POST /api/runs/resources/: one definition, the submit's), shown
// before submitting and refreshed while typing.
const resourcesBody = document.getElementById("resources-body");
let resourcesTimer = 0;
let resourcesAsked = 0;

async function showResources(): Promise<void> {
  if (!resourcesBody) return;
  const asked = ++resourcesAsked;
  const kind = (form.elements.namedItem("kind") as HTMLInputElement).value;
  try {
    const d = await api<Demand>("POST", "/api/runs/resources/", { kind, config: configOf() });
    if (asked !== resourcesAsked) return;
    const rows = d.bundles.map((b) => `<tr><td>${esc(b.role)}</td><td class="num">${esc(b.CPU)}</td><td class="num">${esc(b.GPU)}</td><td class="num">${esc(resText({ memory: b.memory }).split(" · ")[2])}</td></tr>`).join("");
    resourcesBody.innerHTML = `<p style="margin:.2rem 0"><span data-testid="resources-total">${esc(resText(d.total))}</span> in ${d.bundles.length} bundles, placement ${esc(d.strategy)}.</p>
      ${d.fits ? "" : `<p class="alert alert-error" role="alert" data-testid="resources-problem">This run can never start on this cluster: it ${esc(d.problem)}.</p>`}
      <details><summary>Per process</summary><div class="table-wrap"><table><thead><tr><th scope="col">Process</th><th scope="col">CPU</th><th scope="col">GPU</th><th scope="col">Memory</th></tr></thead><tbody>${rows}</tbody></table></div></details>`;
  } catch (err) {
    if (asked !== resourcesAsked) return;
    resourcesBody.innerHTML = `<p class="muted" style="margin:.2rem 0">${err instanceof ApiError && err.status === 400 ? "Shown once the form is valid." : "Could not compute the resources right now."}</p>`;
  }
}

form.addEventListener("input", () => {
  clearTimeout(resourcesTimer);
  resourcesTimer = window.setTimeout(showResources, 300);
});
void showResources();

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  clearErrors();
  const config = configOf();
  const name = (form.elements.namedItem("name") as HTMLInputElement).value.trim();
  const kind = (form.elements.namedItem("kind") as HTMLInputElement).value;
  button.disabled = true;
  button.textContent = "Submitting…";
  try {
    const run = await api<{ id: number }>("POST", "/api/runs/", { name, origin: "dashboard", kind, config });
    location.href = `/?submitted=${run.id}`;
  } catch (err) {
    if (err instanceof ApiError) showErrors(err.body, err.status);
    else { alertBox.textContent = "Could not reach the server; try again."; alertBox.hidden = false; }
    button.disabled = false;
    button.textContent = "Submit run";
  }
});

form.querySelector<HTMLButtonElement>("#reset-defaults")?.addEventListener("click", () => {
  form.querySelectorAll<HTMLInputElement | HTMLSelectElement>("[data-config]").forEach((input) => {
    const def = input.dataset.default ?? "";
    if (input instanceof HTMLInputElement && input.type === "checkbox") input.checked = def === "true";
    else input.value = def;
  });
  clearErrors();
  void showResources();
});
