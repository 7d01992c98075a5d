/** Folds /ws/dashboard/ messages (docs/realtime.md) into the board's state; pure, so it is easy to follow.
 * snapshot {slots, queue, active} replaces everything; run {run} moves one run between the lists;
 * slots {slots, queue} replaces the counts and the waiting line (positions and ETAs move together). */
import type { Run, Slots } from "./lib/model";

export interface BoardState { slots: Slots | null; queued: Run[]; running: Run[] }

/** Apply one message; returns whether anything changed. */
export function applyDashboardMessage(state: BoardState, msg: any, finished: Set<string>): boolean {
  if (!msg || typeof msg !== "object") return false;
  switch (msg.type) {
    case "snapshot":
      if (msg.slots) state.slots = msg.slots;
      state.queued = Array.isArray(msg.queue) ? msg.queue : [];
      state.running = Array.isArray(msg.active) ? msg.active : [];
      return true;
    case "slots":
      if (msg.slots) state.slots = msg.slots;
      if (Array.isArray(msg.queue)) {
        state.queued = msg.queue;
        // A run that left the queue for a slot shows up in `active` through its own `run` message.
        const waiting = new Set(state.queued.map((r) => r.id));
        state.running = state.running.filter((r) => !waiting.has(r.id));
      }
      return true;
    case "run": {
      const run: Run | undefined = msg.run;
      if (!run || typeof run.id !== "number") return false;
      const prev = state.queued.find((r) => r.id === run.id) ?? state.running.find((r) => r.id === run.id);
      const merged: Run = prev ? { ...prev, ...run } : run;
      state.queued = state.queued.filter((r) => r.id !== run.id);
      state.running = state.running.filter((r) => r.id !== run.id);
      if (merged.status === "queued") state.queued.push(merged);
      else if (!finished.has(merged.status)) state.running.push(merged);
      return true;
    }
    default:
      return false;
  }
}
