/** A websocket that reconnects with backoff and shows its state; callers decide the URL on every connect
 * (so a run page can carry its last seen seq and get exactly the events it missed). `M`: the messages the
 * server sends on it (lib/messages.ts, generated from the Python declarations the consumers send). */

export type LiveState = "connecting" | "live" | "reconnecting" | "closed";

export interface LiveOptions<M> {
  url: () => string;
  onMessage: (msg: M) => void;
  onOpen?: (ws: WebSocket) => void;
  onState?: (state: LiveState) => void;
  /** Called with the close code; return false to stop reconnecting (e.g. 4401 logged out, 4403 forbidden). */
  onClose?: (code: number) => boolean | void;
}

export function wsUrl(path: string): string {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  return `${proto}//${location.host}${path}`;
}

export class LiveSocket<M> {
  private ws: WebSocket | null = null;
  private attempt = 0;
  private stopped = false;
  private timer: number | undefined;

  constructor(private opts: LiveOptions<M>) {
    this.connect();
    // A laptop waking up or a network change: reconnect at once instead of waiting for the backoff.
    window.addEventListener("online", () => this.reconnectNow());
  }

  private setState(state: LiveState): void {
    this.opts.onState?.(state);
    const el = document.getElementById("conn-state");
    if (el) {
      el.dataset.state = state;
      el.textContent = state === "live" ? "Live" : state === "connecting" ? "Connecting…" : state === "reconnecting" ? "Reconnecting…" : "Offline";
    }
  }

  private connect(): void {
    this.setState(this.attempt ? "reconnecting" : "connecting");
    const ws = new WebSocket(this.opts.url());
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      this.setState("live");
      this.opts.onOpen?.(ws);
    };
    ws.onmessage = (e) => {
      let msg: M;
      try { msg = JSON.parse(e.data) as M; } catch { return; } // the consumer's declared message, not checked again
      this.opts.onMessage(msg);
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.opts.onClose?.(e.code) === false) this.stopped = true;
      if (this.stopped) return this.setState("closed");
      this.attempt += 1;
      this.setState("reconnecting");
      const delay = Math.min(10_000, 250 * 2 ** Math.min(this.attempt, 6)) * (0.75 + Math.random() * 0.5);
      this.timer = window.setTimeout(() => this.connect(), delay);
    };
  }

  send(obj: unknown): void {
    if (this.ws?.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(obj));
  }

  /** Drop the current connection (tests use it to prove catch-up) and connect again right away. */
  reconnectNow(): void {
    window.clearTimeout(this.timer);
    const old = this.ws;
    this.ws = null;
    old?.close();
    this.connect();
  }

  /** Connect again after close() (tests use close + reopen to prove catch-up by seq). */
  reopen(): void {
    this.stopped = false;
    this.attempt = 0;
    window.clearTimeout(this.timer);
    const old = this.ws;
    this.ws = null;
    if (old && old.readyState < WebSocket.CLOSING) old.close();
    this.connect();
  }

  close(): void {
    this.stopped = true;
    window.clearTimeout(this.timer);
    this.ws?.close();
  }
}
