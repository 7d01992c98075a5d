/** Concurrency settings page (server-rendered, works without JS): a live preview of the effective reserve
 * and the borrowable share while typing, drawn like the queue board's capacity bar. */


function intOf(form: HTMLFormElement, name: string): number | null {
  const el = form.elements.namedItem(name) as HTMLInputElement | null;
  if (!el || el.value.trim() === "") return null;
  const n = Number(el.value);
  return Number.isInteger(n) ? n : NaN;
}

/** The platform's reserve rule: unset means max(1, total // 4); never above total - 1, never below 0. */
export function effectiveReserve(total: number, reserve: number | null): number {
  const wanted = reserve === null ? Math.max(1, Math.floor(total / 4)) : reserve;
  return Math.max(0, Math.min(wanted, total - 1));
}

function preview(form: HTMLFormElement, out: HTMLElement): void {
  const total = intOf(form, "max_total");
  const reserveRaw = intOf(form, "interactive_reserve");
  if (total === null || !Number.isFinite(total) || total < 1 || total > 1000 || (reserveRaw !== null && !Number.isFinite(reserveRaw))) {
    out.innerHTML = `<p class="muted">Enter a whole number of total slots (1–1000) to see the effect.</p>`;
    return;
  }
  const reserve = effectiveReserve(total, reserveRaw);
  const borrowable = total - reserve;
  const cells = total <= 64
    ? Array.from({ length: total }, (_, i) => `<div class="cap-cell${i >= borrowable ? " reserve" : ""}"></div>`).join("")
    : `<div class="cap-cell" style="flex:${borrowable} 1 0"></div>${reserve ? `<div class="cap-cell reserve" style="flex:${reserve} 1 0"></div>` : ""}`;
  const note = reserveRaw !== null && reserveRaw !== reserve ? ` (asked for ${reserveRaw}; clamped to total − 1)` : reserveRaw === null ? " (default: a quarter of the total, at least 1)" : "";
  out.innerHTML = `
    <h2 style="margin:0 0 .4rem;font-size:.95rem">With these values</h2>
    <p style="margin:.2rem 0 .6rem"><strong data-testid="preview-reserve">${reserve}</strong> of ${total} slots reserved for interactive runs${note};
      app, schedule and system runs may borrow up to <strong data-testid="preview-borrowable">${borrowable}</strong> together.</p>
    <div class="cap-bar" role="img" aria-label="${borrowable} borrowable slots and ${reserve} reserved slots">${cells}</div>
    <div class="cap-spans" aria-hidden="true">${borrowable ? `<div class="cap-span borrow" style="flex:${borrowable} 1 0">borrowable · ${borrowable}</div>` : ""}${reserve ? `<div class="cap-span reserve" style="flex:${reserve} 1 0">reserve · ${reserve}</div>` : ""}</div>`;
}

const form = document.querySelector<HTMLFormElement>("form[data-concurrency]") ?? document.querySelector<HTMLFormElement>("form");
if (form && form.elements.namedItem("max_total")) {
  // The server's card states what is in effect now; this one shows what the typed values would do.
  let out = document.getElementById("settings-live-preview");
  if (!out) {
    out = document.createElement("section");
    out.id = "settings-live-preview";
    out.className = "card";
    form.parentElement!.insertBefore(out, form);
  }
  out.setAttribute("aria-live", "polite");
  out.setAttribute("aria-label", "Preview of the effective reserve");
  const update = () => preview(form, out!);
  form.addEventListener("input", update);
  update();
}
