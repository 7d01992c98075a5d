"""Helpers of the liveness tests (test_liveness_start.py, test_liveness_cluster.py): settings with no Ray here,
and a run submitted with the placement group its job waits for."""

from __future__ import annotations

import pytest

from runs.execution.submit import run_submit
from runs.models import Run
from tests.runs.helpers import TEST_JOB_KIND

GROUP = {"bundles": [{"role": r, "CPU": 0.25, "GPU": 0, "memory": 1} for r in ("driver", "learner", "engine-0")]}


@pytest.fixture(autouse=True)
def _artifacts(settings, tmp_path):
    settings.RUN_ARTIFACTS_DIR = str(tmp_path)
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # no Ray here (never the machine's default 8265: maybe someone's)


def submit(user, *, group: bool = True, **kw) -> Run:
    run = run_submit(owner=user, name="r", origin="api", kind=TEST_JOB_KIND, config={}, **kw)
    if group:  # what admission's submit stores for a run whose job waits for a placement group
        Run.objects.filter(pk=run.pk).update(resources=GROUP)
    run.refresh_from_db()
    return run
