"""Modules stay small (docs/README.md): no Python file in runs/, trainer/ or rollout/ is over 300 lines. Split a
module that grows by responsibility, not by trimming it to fit."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("runs", "trainer", "rollout")
MAX_LINES = 300


def test_no_module_over_300_lines():
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for package in CHECKED
        for path in sorted((REPO / package).rglob("*.py"))
    }
    assert len(sizes) > 100, "the packages were not found"
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
