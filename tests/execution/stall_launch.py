"""Loaded into a test's Celery worker (`--include tests.execution.stall_launch`): every launch stalls after
its Ray job was submitted and before the run is recorded as running, so a test can SIGKILL the worker in
exactly that window. Nothing else changes: the real submit, the real task, the real worker."""

from __future__ import annotations

import os
import time

from celery.signals import worker_process_init


@worker_process_init.connect
def stall_after_submit(**_: object) -> None:
    import runs.execution.ray as launch

    real_submit = launch.job_submit
    stall = float(os.environ.get("TEST_LAUNCH_STALL_SECONDS", "120"))

    def submit_then_stall(run, spec):  # type: ignore[no-untyped-def]
        submission_id = real_submit(run, spec)
        time.sleep(stall)
        return submission_id

    launch.job_submit = submit_then_stall
