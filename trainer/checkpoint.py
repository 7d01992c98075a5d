"""Checkpoint directory layout and atomic save/load.

    DIR/latest                  name of the newest complete checkpoint (written last, atomically)
    DIR/step-000012/meta.json   format, step, version, config, sampler progress, time (readable without torch)
    DIR/step-000012/state.pt    policy, optimizer, sampler and scheduler state (ready groups), RNG states

A checkpoint directory is written under a temporary name and renamed, so a crash mid-save leaves the previous
checkpoint as `latest`. `state.pt` holds only plain data (tensors and containers of primitives; groups are
dicts, see trainer.plain) and is read with `torch.load(weights_only=True)`: a checkpoint cannot run code.
`latest` must name a `step-NNNNNN` directory inside DIR (no other path is followed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

# 2: plain data only (weights_only loading). Format 1 (no "format" key) pickled groups and is not loaded.
# 3: groups are ragged (`rows`); format 2's lock-step groups still load (trainer.plain converts them).
CHECKPOINT_FORMAT = 3
READ_FORMATS = (2, 3)
_STEP_NAME = re.compile(r"step-\d{6,}")


def checkpoint_save(
    directory: str | os.PathLike[str], *, step: int, meta: dict[str, Any], state: dict[str, Any], keep: int = 3
) -> Path:
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(
        json.dumps({**meta, "format": CHECKPOINT_FORMAT, "step": step, "saved_at": time.time()}, indent=2)
    )
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoint_latest(directory: str | os.PathLike[str]) -> Path | None:
    root = Path(directory)
    marker = root / "latest"
    if marker.exists():
        name = marker.read_text().strip()
        path = root / name
        # Only a step directory of this DIR: never an absolute path, `..` or a symlink out of it.
        if (
            _STEP_NAME.fullmatch(name)
            and (path / "state.pt").exists()
            and not any(p.is_symlink() for p in (path, path / "state.pt", path / "meta.json"))
        ):
            return path
    if (root / "state.pt").exists():  # DIR may name a step directory itself
        return root
    return None


def checkpoint_load(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta, state) of a checkpoint directory (a run's DIR or one step-* inside it)."""
    found = checkpoint_latest(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint under {path}")
    meta = json.loads((found / "meta.json").read_text())
    if meta.get("format") not in READ_FORMATS:
        raise ValueError(
            f"checkpoint {found} has format {meta.get('format', 1)}, this trainer reads formats "
            f"{', '.join(map(str, READ_FORMATS))} (format 1 pickled Python objects and is not loaded)"
        )
    state = torch.load(found / "state.pt", weights_only=True, map_location="cpu")
    return meta, state
