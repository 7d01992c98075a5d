/** The run page's cancel, resume and start-over buttons, each behind a <dialog> confirmation, through
 * POST /api/runs/<id>/cancel|resume/ (docs/api.md). The page owns the run and its status events: a status
 * event that arrived while the request was out wins over the reply. */
import { api, ApiError, errorMessages } from "./lib/api";
import type { RunJson } from "./lib/messages";

type Action = "cancel" | "resume" | "restart";

export interface RunActionsHost {
  run: () => Pick<RunJson, "id" | "name">;
  checkpointStep: () => number | null; // the step a resume continues from; null: the run has no checkpoint
  statusSeq: () => number; // seq of the newest status event the page applied
  replied: (updated: RunJson) => void; // the API's answer, when no newer status event came first
  changed: () => void; // redraw
}

export function runActions(host: RunActionsHost): void {
  const dialog = document.getElementById("confirm") as HTMLDialogElement;
  const message = document.getElementById("action-message")!;

  async function act(action: Action): Promise<void> {
    message.hidden = true;
    const id = host.run().id;
    try {
      const before = host.statusSeq();
      // Start over is a resume that says so; a plain resume of a run without a checkpoint is a 409 no_checkpoint.
      const updated = action === "restart"
        ? await api<RunJson>("POST", `/api/runs/${id}/resume/`, { from_scratch: true })
        : await api<RunJson>("POST", `/api/runs/${id}/${action}/`);
      // The stream may already have carried a newer status (e.g. cancelled right after stopping) before this
      // response arrived; the response only counts when nothing newer came.
      if (host.statusSeq() === before) host.replied(updated);
      message.className = "alert alert-ok";
      message.textContent = action === "cancel" ? "Cancel requested: the run is stopping."
        : action === "resume" ? "Resume requested: the run is back in the queue."
        : "Start over requested: the run is back in the queue and starts from step 0.";
    } catch (e) {
      message.className = "alert alert-error";
      message.textContent = e instanceof ApiError ? errorMessages(e.body).join("; ") || `Request failed (${e.status})` : "Network error";
    }
    message.hidden = false;
    host.changed();
  }

  const step = host.checkpointStep;
  const CONFIRM: Record<Action, { title: string; text: () => string; ok: string; okClass: string }> = {
    cancel: { title: "Cancel run", ok: "Cancel run", okClass: "btn btn-danger solid",
      text: () => "The job is asked to stop; it saves a checkpoint if it can, and its slot goes to the next run in line." },
    resume: { title: "Resume run", ok: "Resume run", okClass: "btn btn-primary",
      text: () => `The run goes back into the queue and continues from its checkpoint at step ${step()} when it gets a slot.` },
    restart: { title: "Start over run", ok: "Start over", okClass: "btn btn-danger solid",
      text: () => "The run goes back into the queue and trains again from step 0 when it gets a slot"
        + (step() === null ? " (it has no checkpoint)." : `, not from its checkpoint at step ${step()}.`) },
  };

  function confirmThen(action: Action): void {
    const c = CONFIRM[action];
    document.getElementById("confirm-title")!.textContent = `${c.title} “${host.run().name}”?`;
    document.getElementById("confirm-text")!.textContent = c.text();
    const ok = document.getElementById("confirm-ok") as HTMLButtonElement;
    ok.textContent = c.ok;
    ok.className = c.okClass;
    dialog.returnValue = "";
    dialog.showModal();
    dialog.addEventListener("close", () => { if (dialog.returnValue === "ok") void act(action); }, { once: true });
  }

  document.getElementById("btn-cancel")!.addEventListener("click", () => confirmThen("cancel"));
  document.getElementById("btn-resume")!.addEventListener("click", () => confirmThen("resume"));
  document.getElementById("btn-restart")!.addEventListener("click", () => confirmThen("restart"));
}
