/** The run page's Chat panel: the owner (or staff) talks to the run's current policy through the platform's
 * proxy (POST /api/runs/<id>/v1/chat/completions, browser session + CSRF; runs/api/proxy.py) and sees, under
 * each answer, every token with the weight version that produced it. The versions come from the session
 * server's answer: `choices[0].logprobs.content[i].token` (asked with `logprobs: true`) paired with
 * `rl.versions[i]`; an answer without them shows its text and `rl.version`. One session per page load (the
 * proxy namespaces it as external: never trained). Everything is drawn with textContent. */
import { csrfToken } from "./lib/api";
import type { RunJson } from "./lib/messages";

const MAX_TOKENS = 64;
const HISTORY_MAX = 40; // messages sent back with each turn (the proxy takes at most 256)

type Message = { role: "user" | "assistant"; content: string };

/** What this panel reads of an answer: the session server's chat completion (agents/openai_shapes.py, not a
 * declared type: its body is built as a dict), or a refusal (the proxy's `detail`, the server's `error`). Every
 * key may be missing, so each read checks. */
interface ChatReply {
  model?: unknown;
  choices?: { message?: { content?: unknown }; logprobs?: { content?: { token?: unknown }[] } }[];
  rl?: { version?: unknown; versions?: unknown };
  detail?: unknown;
  error?: { message?: unknown };
}

function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** The message of a refused request: the proxy's `detail`, the session server's `error.message`, or the status. */
function refusal(status: number, body: ChatReply | null): string {
  const text = (body && (body.detail ?? body.error?.message)) || `request failed (HTTP ${status})`;
  if (status === 503) return `The run is not serving yet: ${text}`;
  return String(text);
}

export class ChatPanel {
  private root = document.getElementById("chat");
  private form = document.getElementById("chat-form") as HTMLFormElement | null;
  private input = document.getElementById("chat-input") as HTMLTextAreaElement | null;
  private send = document.getElementById("chat-send") as HTMLButtonElement | null;
  private status = document.getElementById("chat-status");
  private log = document.getElementById("chat-log");
  private history: Message[] = [];
  private session = `chat-${Math.random().toString(36).slice(2, 12)}`;
  private busy = false;

  constructor(private run: () => RunJson) {
    this.form?.addEventListener("submit", (e) => { e.preventDefault(); void this.ask(); });
    this.update();
  }

  /** Sending is possible while the run is running (the proxy answers 503 until its server is reported). */
  update(): void {
    if (!this.root || !this.send || !this.status) return;
    const running = this.run().status === "running";
    this.send.disabled = this.busy || !running;
    if (!this.busy) this.status.textContent = running ? "" : "The chat works while the run is running.";
  }

  private async ask(): Promise<void> {
    const text = this.input?.value.trim() ?? "";
    if (!text || this.busy || !this.log || !this.status) return;
    this.busy = true;
    this.update();
    this.status.textContent = "Waiting for the policy…";
    this.history.push({ role: "user", content: text });
    this.log.append(el("div", "chat-msg chat-user", text));
    if (this.input) this.input.value = "";
    try {
      const resp = await fetch(`/api/runs/${this.run().id}/v1/chat/completions`, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({
          messages: this.history.slice(-HISTORY_MAX),
          session_id: this.session,
          max_tokens: MAX_TOKENS,
          logprobs: true,
        }),
      });
      let body: ChatReply | null = null;
      try { body = (await resp.json()) as ChatReply; } catch { body = null; }
      if (!resp.ok) throw new Error(refusal(resp.status, body));
      const content = String(body?.choices?.[0]?.message?.content ?? "");
      this.history.push({ role: "assistant", content });
      this.log.append(this.answer(body, content));
      this.status.textContent = "";
    } catch (e) {
      this.history.pop(); // not answered: not part of the conversation
      this.status.textContent = e instanceof Error ? e.message : "Network error";
    } finally {
      this.busy = false;
      this.update();
    }
  }

  /** An answer: its text, then each token with its version (title and a small label). */
  private answer(body: ChatReply | null, content: string): HTMLElement {
    const box = el("div", "chat-msg chat-assistant");
    const rl = body?.rl ?? {};
    const versions: unknown[] = Array.isArray(rl.versions) ? rl.versions : [];
    const listed = body?.choices?.[0]?.logprobs?.content;
    const tokens: { token?: unknown }[] = Array.isArray(listed) ? listed : [];
    const head = el("div", "chat-meta muted", `${String(body?.model ?? "")}${typeof rl.version === "number" ? ` · version ${rl.version}` : ""}`);
    box.append(head, el("div", "chat-text", content));
    if (tokens.length) {
      const row = el("div", "chat-tokens");
      row.setAttribute("aria-label", "tokens with the weight version of each");
      tokens.forEach((t, i) => {
        const version = versions[i];
        const chip = el("span", "chat-token");
        chip.append(el("span", "chat-token-text", String(t?.token ?? "")), el("sub", "chat-token-v", `v${String(version ?? "?")}`));
        chip.title = `token ${i}: version ${String(version ?? "unknown")}`;
        chip.dataset.version = String(version ?? "");
        row.append(chip);
      });
      box.append(row);
    }
    return box;
  }
}
