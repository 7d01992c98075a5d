"""The shipped assets: the TypeScript sources type-check (strict), and what the pages load stays small."""

from __future__ import annotations

import gzip
import subprocess

from tests.browser.stack import REPO_ROOT

DIST = REPO_ROOT / "frontend" / "static" / "dist"


def test_sources_type_check() -> None:
    tsc = REPO_ROOT / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), "node_modules is missing: run `make frontend` (make test does)"
    done = subprocess.run([str(tsc), "-p", "tsconfig.json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr


def test_bundle_is_built_and_small() -> None:
    files = [p for p in DIST.rglob("*") if p.suffix in {".js", ".css"}]
    names = {p.name for p in files}
    assert {"board.js", "run.js", "submit.js", "settings.js", "compare.js", "common.js", "app.css"} <= names, names
    gz_kb = sum(len(gzip.compress(p.read_bytes(), 9)) for p in files) / 1024
    assert gz_kb <= 150, f"shipped JS+CSS is {gz_kb:.1f} KB gzip (budget 150)"
