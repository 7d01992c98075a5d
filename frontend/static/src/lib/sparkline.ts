/** Tiny SVG sparklines for the queue board (uPlot would be too heavy for one per row). The label is
 * user-controlled (it carries the run name): it only ever reaches the markup through `esc`. */
import { esc } from "./format";

export function sparkline(values: number[], label: string, width = 120, height = 30): string {
  const pts = values.filter((v) => typeof v === "number" && isFinite(v)).slice(-60);
  if (pts.length < 2) return `<svg class="spark" role="img" aria-label="${esc(`${label}: not enough data`)}" viewBox="0 0 ${width} ${height}"></svg>`;
  let lo = Math.min(...pts), hi = Math.max(...pts);
  if (hi - lo < 1e-9) { hi += 0.5; lo -= 0.5; }
  const dx = width / (pts.length - 1);
  const y = (v: number) => (height - 2 - ((v - lo) / (hi - lo)) * (height - 4)).toFixed(1);
  const line = pts.map((v, i) => `${i ? "L" : "M"}${(i * dx).toFixed(1)},${y(v)}`).join("");
  const area = `${line}L${width},${height}L0,${height}Z`;
  const last = pts[pts.length - 1];
  const text = `${label}: latest ${last.toPrecision(3)}, range ${lo.toPrecision(3)} to ${hi.toPrecision(3)}`;
  return `<svg class="spark" role="img" aria-label="${esc(text)}" viewBox="0 0 ${width} ${height}" preserveAspectRatio="none"><path class="area" d="${area}"/><path d="${line}"/></svg>`;
}
