"""rollout/ never pulls in Django, DRF, Channels or Celery: each module imported alone in a fresh interpreter."""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import rollout

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("django", "rest_framework", "channels", "celery")


def rollout_modules() -> list[str]:
    names = ["rollout"]
    for info in pkgutil.walk_packages(rollout.__path__, prefix="rollout."):
        names.append(info.name)
    return sorted(names)


def test_every_rollout_module_imports_without_django():
    modules = rollout_modules()
    assert {"rollout.gate", "rollout.scheduler", "rollout.channel.channel", "rollout.filters"} <= set(modules)
    # One interpreter per module, so one module cannot hide another's import.
    probe = (
        "import importlib, json, sys; importlib.import_module(sys.argv[1]); "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    procs = {
        m: subprocess.Popen(
            [sys.executable, "-c", probe, m],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(REPO), "PATH": ""},
        )
        for m in modules
    }
    for module, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"import {module} failed: {err[-2000:]}"
        assert json.loads(out.strip().splitlines()[-1]) == [], f"{module} imported {out}"
