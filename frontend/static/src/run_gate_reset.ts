/** Staff only: reset a run's poisoned gate from its page. The button shows while the run is running and its
 * gate is poisoned (and exists only for staff: the template renders it for them alone; the API checks again).
 * The reason is required and audited (runs/execution/controls.py); the job answers with a `control` event. */
import { api, ApiError, errorMessages } from "./lib/api";
import type { RunJson } from "./lib/messages";

export class GateReset {
  private button = document.getElementById("btn-gate-reset") as HTMLButtonElement | null;
  private dialog = document.getElementById("gate-reset") as HTMLDialogElement | null;

  constructor(private run: () => RunJson, private say: (ok: boolean, text: string) => void) {
    if (!this.button || !this.dialog) return; // not staff
    const dialog = this.dialog;
    this.button.addEventListener("click", () => {
      (document.getElementById("gate-reset-reason") as HTMLTextAreaElement).value = "";
      dialog.returnValue = "";
      dialog.showModal();
    });
    dialog.addEventListener("close", () => { if (dialog.returnValue === "ok") void this.send(); });
  }

  update(): void {
    if (!this.button) return;
    const run = this.run();
    this.button.hidden = !(run.status === "running" && run.summary.gate?.state === "poisoned");
  }

  private async send(): Promise<void> {
    const reason = (document.getElementById("gate-reset-reason") as HTMLTextAreaElement).value;
    try {
      const control = await api<{ id: number }>("POST", `/api/runs/${this.run().id}/gate-reset/`, { reason });
      this.say(true, `Gate reset #${control.id} sent: the job re-checks engine versions, then reopens (see its control event).`);
    } catch (e) {
      this.say(false, e instanceof ApiError ? errorMessages(e.body).join("; ") || `Request failed (${e.status})` : "Network error");
    }
  }
}
