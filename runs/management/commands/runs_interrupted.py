"""`manage.py runs_interrupted --stopping | --starting`: requeue the runs whose jobs the platform's own stop or
restart ended (runs/execution/restart.py). platform/up.py runs `--stopping` once the jobs it stopped have
ended (their checkpoints recorded) and before Ray goes, and `--starting` once Ray answers and before the tick
and the worker start. Exits 1 when Ray's job API does not answer (nothing is changed then) or some run's job could
not be read (those runs are unchanged; the others are done)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.execution.restart import UNREAD, runs_interrupted


class Command(BaseCommand):
    help = "Put the runs that the platform's stop or restart took from Ray back in the queue, to resume."

    def add_arguments(self, parser: CommandParser) -> None:
        when = parser.add_mutually_exclusive_group(required=True)
        when.add_argument("--stopping", action="store_true", help="the platform is stopping; its jobs have ended")
        when.add_argument("--starting", action="store_true", help="the platform is starting; before its tick")

    def handle(self, *args: Any, **options: Any) -> None:
        done = runs_interrupted(stopping=bool(options["stopping"]))
        if done is None:
            raise CommandError("Ray's job API is not reachable: no run changed")
        unread = sorted(pk for pk, what in done.items() if what == UNREAD)
        if unread:  # exit 1: platform/up.py tries again before the tick could take them for lost
            raise CommandError(f"the jobs of runs {unread} could not be read: those runs are unchanged")
        requeued = sorted(pk for pk, what in done.items() if what == "requeued")
        self.stdout.write(f"{len(requeued)} run(s) requeued to resume" + (f": {requeued}" if requeued else ""))
