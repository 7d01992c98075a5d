"""Resource vectors for admission, pure: what a run asks for (its bundles), what a node has free, and whether
all of a run's bundles fit at once (gang placement: every bundle is placed, or none is).

Units are integers so sums never drift: CPUs and GPUs in thousandths, memory in bytes. JSON uses Ray's names
and units (`{"CPU": 0.25, "GPU": 0, "memory": 536870912}`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MILLI = 1000
NAMES = ("CPU", "GPU", "memory")
STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD")


@dataclass(frozen=True, order=True)
class Res:
    cpu: int = 0  # thousandths of a CPU
    gpu: int = 0  # thousandths of a GPU
    memory: int = 0  # bytes

    def __add__(self, other: Res) -> Res:
        return Res(self.cpu + other.cpu, self.gpu + other.gpu, self.memory + other.memory)

    def __sub__(self, other: Res) -> Res:
        return Res(self.cpu - other.cpu, self.gpu - other.gpu, self.memory - other.memory)

    def fits_in(self, other: Res) -> bool:
        return self.cpu <= other.cpu and self.gpu <= other.gpu and self.memory <= other.memory

    def short_of(self, other: Res) -> list[str]:
        """The resource names (Ray's) in which `other` has less than this vector."""
        return [n for n, mine, theirs in zip(NAMES, self.values(), other.values()) if mine > theirs]

    def values(self) -> tuple[int, int, int]:
        return (self.cpu, self.gpu, self.memory)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Res:
        """From Ray-style JSON; missing names are 0. Negative or non-numeric values raise ValueError."""
        values = []
        for name in NAMES:
            raw = d.get(name, 0) or 0
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
                raise ValueError(f"{name}: expected a non-negative number, got {raw!r}")
            values.append(int(raw) if name == "memory" else round(raw * MILLI))
        return cls(*values)

    def to_json(self) -> dict[str, Any]:
        return {"CPU": self.cpu / MILLI, "GPU": self.gpu / MILLI, "memory": self.memory}


ZERO = Res()


def total(bundles: Sequence[Res]) -> Res:
    out = ZERO
    for b in bundles:
        out = out + b
    return out


def pack(bundles: Sequence[Res], free: Mapping[str, Res], strategy: str = "PACK") -> list[str] | None:
    """A node id for every bundle such that each node's share fits its free resources, or None when the whole
    run cannot be placed. First-fit decreasing (largest GPU, then CPU, then memory first) over nodes in id order;
    STRICT_PACK puts every bundle on one node. SPREAD is a preference in Ray, so its feasibility is PACK's.
    Deterministic for equal inputs."""
    nodes = sorted(free)
    if strategy == "STRICT_PACK":
        need = total(bundles)
        for node in nodes:
            if need.fits_in(free[node]):
                return [node] * len(bundles)
        return None
    left = dict(free)
    placed: list[str | None] = [None] * len(bundles)
    order = sorted(range(len(bundles)), key=lambda i: bundles[i].values(), reverse=True)
    for i in order:
        for node in nodes:
            if bundles[i].fits_in(left[node]):
                left[node] = left[node] - bundles[i]
                placed[i] = node
                break
        else:
            return None
    return [n for n in placed if n is not None]


def free_after(capacity: Mapping[str, Res], held: Sequence[tuple[Sequence[Res], Sequence[str]]]) -> dict[str, Res]:
    """Per-node free resources: node capacity minus every held run's bundles on the nodes they were placed on.
    A bundle placed on a node that is gone is not charged anywhere (that node's capacity is gone with it)."""
    left = dict(capacity)
    for bundles, placement in held:
        for bundle, node in zip(bundles, placement):
            if node in left:
                left[node] = left[node] - bundle
    return left
