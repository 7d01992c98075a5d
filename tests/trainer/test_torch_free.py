"""A rollout worker or the channel never loads torch, even while it holds engine handles (the web stack:
tests/trainer/test_imports.py).

Ray imports an actor class's module in any process that unpickles a handle to that actor, so `trainer.engine`
keeps torch and the model code out of its module level (they load when an engine is built). Measured: torch adds
about 1.4 s of CPU and 250 MiB to a process (docs/trainer.md, "What a process imports")."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from tests.conftest import REPO_ROOT
from trainer.config import TrainConfig
from trainer.engine import Engine

LIGHT = ["trainer.engine", "trainer.worker", "trainer.episodes", "rollout.channel", "rollout.publication"]


def torch_modules() -> list[str]:
    return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))


def test_the_rollout_side_modules_do_not_import_torch() -> None:
    code = f"import sys\nfor m in {LIGHT!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.slow
def test_a_process_holding_an_engine_handle_does_not_load_torch(ray_driver) -> None:
    ray = ray_driver

    class Holder:
        """Stands for a rollout worker: it is handed engine handles and calls them."""

        def modules(self, engines: list) -> tuple[list[str], list[str]]:
            return torch_modules(), ray.get([e.ping.remote() for e in engines])

    engine = ray.remote(Engine).options(num_cpus=0.25).remote(TrainConfig(group_size=4, device="cpu"), "e0")
    # Its own runtime env: a fresh worker process, never one a test before this one had import torch.
    fresh = {"env_vars": {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), "PROBE": uuid.uuid4().hex}}
    holder = ray.remote(Holder).options(num_cpus=0.1, runtime_env=fresh).remote()
    try:
        loaded, answered = ray.get(holder.modules.remote([engine]), timeout=120)
    finally:  # their CPU back to the shared cluster, whatever failed (the placement tests wait for an idle one)
        ray.kill(holder)
        ray.kill(engine)
    assert answered == ["e0"]  # it really held a working handle (Ray loaded the Engine class for it)
    assert loaded == [], loaded
