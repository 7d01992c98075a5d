/** How one sample is drawn when expanded (turns, every generated token coloured by how many versions behind
 * the step's weights it was produced, reward parts) and the side-by-side view of one prompt across steps.
 * Everything from the server goes in as text nodes (lib/dom.ts). */
import { el } from "./lib/dom";
import { num } from "./lib/format";
import type { Sample, SampleTurn } from "./lib/samples";

const AGES = 5; // colour classes age-0 (the step's own weights) .. age-4 (4 or more versions behind)

function age(step: number, version: number | undefined): number {
  return Math.max(0, Math.min(AGES - 1, step - 1 - (version ?? step - 1)));
}

export function versionLegend(): HTMLElement {
  const items = Array.from({ length: AGES }, (_, k) =>
    el("span", {}, el("span", { class: `tok-sw age-${k}` }), k === 0 ? "step's weights" : k === AGES - 1 ? `${k}+ versions behind` : `${k} behind`));
  return el("span", { class: "legend" }, "Tokens by version:", ...items);
}

function turnNode(turn: SampleTurn, step: number): HTMLElement {
  if (turn.role === "tool") return el("div", { class: "turn turn-tool" }, el("span", { class: "turn-role" }, "tool"), el("code", {}, turn.text));
  const cls = `age-${age(step, turn.version)}`;
  const tokens = el("code", { class: "tokens" });
  for (const ch of Array.from(turn.text)) tokens.append(el("span", { class: `tok ${cls}`, title: `version ${turn.version ?? "?"}` }, ch));
  return el("div", { class: "turn turn-policy", "data-version": String(turn.version ?? "") },
    el("span", { class: "turn-role" }, `policy · v${turn.version ?? "?"}`), tokens,
    el("span", { class: "muted turn-meta" }, [turn.engine, turn.request].filter(Boolean).join(" · ")));
}

export function sampleDetail(s: Sample, acrossHref: string): HTMLElement {
  const parts = Object.entries(s.reward_parts ?? {});
  const facts: [string, string][] = [
    ["id", String(s.id)], ["step", String(s.step)], ["group", `${s.group} #${s.index}`], ["picked as", s.pick],
    ["reward", num(s.reward)], ["advantage", num(s.advantage)], ["versions", `${s.version_min}–${s.version_max}`],
    ["staleness", String(s.staleness)], ["finish", s.finish_reason], ["engine", s.engine], ["session", s.session],
  ];
  return el("div", { class: "sample-detail", "data-sample": String(s.id) },
    el("dl", { class: "facts" }, ...facts.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v)))),
    el("div", { class: "turn turn-prompt" }, el("span", { class: "turn-role" }, "prompt"), el("code", {}, s.prompt)),
    ...(s.turns ?? []).map((t) => turnNode(t, s.step)),
    parts.length
      ? el("table", { class: "reward-parts" }, el("caption", {}, "Reward parts"),
        ...parts.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", { class: "num" }, num(v)))))
      : el("p", { class: "muted" }, "This task's reward has no parts."),
    el("p", {}, el("a", { href: acrossHref, class: "btn", "data-testid": "across-link" }, "Same prompt across steps")),
  );
}

/** Samples of one prompt side by side, one column per step (the page asks ordering=step). */
export function acrossView(samples: Sample[]): HTMLElement {
  const byStep = new Map<number, Sample[]>();
  for (const s of samples) byStep.set(s.step, [...(byStep.get(s.step) ?? []), s]);
  const columns = [...byStep.entries()].sort((a, b) => a[0] - b[0]).map(([step, rows]) =>
    el("div", { class: "across-col", "data-step": String(step) }, el("h3", {}, `step ${step}`),
      ...rows.map((s) => el("div", { class: "across-card" },
        el("code", { class: "tokens" }, ...(s.turns ?? [{ role: "policy", text: s.completion, version: s.version_max } as SampleTurn])
          .filter((t) => t.role === "policy")
          .flatMap((t) => Array.from(t.text).map((ch) => el("span", { class: `tok age-${age(s.step, t.version)}` }, ch)))),
        el("span", { class: "num muted" }, `reward ${num(s.reward)} · adv ${num(s.advantage)}`)))));
  return el("div", { class: "across" }, samples.length ? el("p", { class: "muted" }, "Prompt: ", el("code", {}, samples[0].prompt)) : null, ...columns);
}
