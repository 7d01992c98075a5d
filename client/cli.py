"""`python -m client VERB ...`: the client's calls from a shell. Exit status of `submit --wait/--follow` is the
run's end: 0 succeeded, 1 failed, 2 cancelled (3: the API refused, 4: the platform unreachable)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from client.api import Client
from client.errors import ApiError, ConnectionFailed
from client.types import Event, Run

EXIT = {"succeeded": 0, "failed": 1, "cancelled": 2}
EXIT_REFUSED, EXIT_UNREACHABLE = 3, 4


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        with Client(args.url, args.token) as api:
            return int(args.verb(api, args))
    except ApiError as exc:
        print(f"error: {exc.detail}" + (f" (field {exc.field})" if exc.field else ""), file=sys.stderr)
        return EXIT_REFUSED
    except (ConnectionFailed, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m client", description="RL control plane client")
    top.add_argument("--url", help="the platform (default: RLCP_URL, the config file, http://127.0.0.1:8000)")
    top.add_argument("--token", help="an API token (default: RLCP_TOKEN or the config file)")
    top.add_argument("--json", action="store_true", help="JSON output, one object per line")
    verbs = top.add_subparsers(required=True, metavar="VERB")
    submit = verbs.add_parser("submit", help="submit a run")
    submit.add_argument("--config", required=True, type=argparse.FileType(), help="the run config, a JSON file")
    submit.add_argument("--name", default="cli run")
    submit.add_argument("--kind", default="rl_train")
    submit.add_argument("--wait", action="store_true", help="return when the run has ended; exit with its state")
    submit.add_argument("--follow", action="store_true", help="show its events live until it ends")
    submit.set_defaults(verb=cmd_submit)
    runs = verbs.add_parser("runs", help="list your runs")
    runs.add_argument("--status")
    runs.add_argument("--limit", type=int, default=20)
    runs.set_defaults(verb=cmd_runs)
    verbs.add_parser("queue", help="the slots: who holds them, who waits").set_defaults(verb=cmd_queue)
    explain = verbs.add_parser("explain", help="why a run waits: position, reason, ETA, priority factors")
    explain.add_argument("run_id", type=int)
    explain.set_defaults(verb=cmd_explain)
    cancel = verbs.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", type=int)
    cancel.set_defaults(verb=cmd_cancel)
    return top


def cmd_submit(api: Client, args: argparse.Namespace) -> int:
    config = json.load(args.config)
    run = api.submit(name=args.name, kind=args.kind, config=config)
    show(args, run, f"run {run['id']} {run['status']}")
    if not (args.wait or args.follow):
        return 0
    live = LiveLine(args) if args.follow else None
    final = api.wait(run["id"], on_event=live.event if live else None)
    if live:
        live.done()
    show(args, final, f"run {final['id']} {final['status']}" + (f": {final['error']}" if final["error"] else ""))
    return EXIT.get(final["status"], 1)


def cmd_runs(api: Client, args: argparse.Namespace) -> int:
    for i, run in enumerate(api.list(status=args.status)):
        if i >= args.limit:
            break
        show(args, run, f"{run['id']:>6}  {run['status']:<10} {run['kind']:<8} {run['name']}")
    return 0


def cmd_queue(api: Client, args: argparse.Namespace) -> int:
    slots = api.slots()
    if args.json:
        print(json.dumps(slots))
        return 0
    for key, value in slots.items():
        print(f"{key}: {json.dumps(value)[:200]}")
    return 0


def cmd_explain(api: Client, args: argparse.Namespace) -> int:
    run = api.get(args.run_id)
    facts: dict[str, Any] = {
        k: run[k] for k in ("status", "position", "pending_reason", "eta_seconds", "eta_finish_seconds")
    }
    factors = api.priority(args.run_id)["factors"] if run["status"] == "queued" else None
    text = [f"{k}: {v}" for k, v in facts.items()]
    if factors:
        text += [f"priority {k}: {json.dumps(v)}" for k, v in factors.items() if k != "key"]
    show(args, {"id": run["id"], **facts, "factors": factors}, "\n".join(text))
    return 0


def cmd_cancel(api: Client, args: argparse.Namespace) -> int:
    run = api.cancel(args.run_id)
    show(args, run, f"run {run['id']} {run['status']}")
    return 0


def show(args: argparse.Namespace, obj: Run | dict[str, Any], text: str) -> None:
    print(json.dumps(obj) if args.json else text, flush=True)


class LiveLine:
    """While following: one line per event with --json; else a status line kept current (gate, version, step,
    reward) and status moves printed as they come."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.json = args.json
        self.state: dict[str, Any] = {}
        self.tty = sys.stdout.isatty()

    def event(self, event: Event) -> None:
        if self.json:
            print(json.dumps(event), flush=True)
            return
        data, kind = event["data"], event["type"]
        if kind == "status":
            self._line(f"status {data.get('previous')} -> {data.get('status')}", keep=True)
        elif kind == "gate":
            self.state["gate"] = data.get("state")
        elif kind == "version":
            self.state["version"] = data.get("version")
        elif kind == "train":
            self.state |= {"step": data.get("step"), "reward": data.get("reward_mean")}
        if kind in ("gate", "version", "train"):
            parts = [f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.state.items()]
            self._line(" | ".join(parts), keep=not self.tty)

    def _line(self, text: str, *, keep: bool) -> None:
        print(("\r\x1b[K" if self.tty else "") + text, end="\n" if keep else "", flush=True)

    def done(self) -> None:
        if self.tty and not self.json:
            print(flush=True)
