"""trainer/ never pulls in Django, DRF, Channels or Celery (a Ray worker must not load the web stack)."""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import trainer

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("django", "rest_framework", "channels", "celery")


def test_no_trainer_module_imports_the_web_stack() -> None:
    modules = sorted(
        info.name
        for info in pkgutil.walk_packages(trainer.__path__, prefix="trainer.")
        if info.name != "trainer.__main__"
    )  # importing __main__ would run the CLI
    assert {"trainer.loop", "trainer.topology", "trainer.engine", "trainer.worker", "trainer.cli"} <= set(modules)
    # A fresh interpreter: whatever any of them imports shows up in sys.modules.
    probe = (
        "import importlib, json, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "", "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_debug_phases_checkpointing_and_stopping_use_only_public_members_of_the_run() -> None:
    """phases, publishing, resume, stopping and step_report drive a TrainingRun from outside: public members only."""
    import ast

    for module in ("phases", "publishing", "resume", "stopping", "step_report"):
        tree = ast.parse((REPO / "trainer" / f"{module}.py").read_text())
        private = sorted(
            {
                node.attr
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "run"
                and node.attr.startswith("_")
            }
        )
        assert private == [], f"trainer/{module}.py uses private members of the run: {private}"
