"""Per-step distributions for the `train` event: bucket counts of reward, advantage, response length and
staleness over the samples a step trained on, against bucket edges fixed for the whole run.

Pure functions, no I/O. Edges are fixed per run (from the config and the task's bounds) so that the dashboard
can stack steps into a heatmap without re-binning; values outside the edges count in the first or last bucket.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable

from trainer.episodes import Group
from trainer.events import HISTOGRAM_KEYS, HistogramSummary

REWARD_BUCKETS = 10
ADVANTAGE_BUCKETS = 12
LENGTH_BUCKETS_MAX = 16


def linear_edges(lo: float, hi: float, n: int) -> list[float]:
    """n equal buckets from lo to hi: n + 1 increasing edges."""
    if not (n >= 1 and hi > lo):
        raise ValueError(f"need n >= 1 and hi > lo, got n={n}, lo={lo}, hi={hi}")
    return [(lo * (n - i) + hi * i) / n for i in range(n)] + [float(hi)]  # exact at both ends and a 0 centre


def integer_edges(lo: int, hi: int) -> list[float]:
    """One bucket per integer from lo to hi inclusive, centred on it (edges at k - 0.5)."""
    return [k - 0.5 for k in range(lo, hi + 2)]


def run_edges(*, group_size: int, max_staleness: int, response_len_max: int) -> dict[str, list[float]]:
    """The bucket edges of one run. Rewards of the built-in tasks are shares in [0, 1]; a group-normalised
    advantage lies within +-sqrt(G - 1) (population std); staleness is an integer from 0 to max_staleness."""
    bound = math.sqrt(max(1, group_size - 1))
    if response_len_max + 1 <= LENGTH_BUCKETS_MAX:
        length = integer_edges(0, response_len_max)
    else:
        length = linear_edges(0.0, float(response_len_max), LENGTH_BUCKETS_MAX)
    return {
        "reward": linear_edges(0.0, 1.0, REWARD_BUCKETS),
        "advantage": linear_edges(-bound, bound, ADVANTAGE_BUCKETS),
        "response_length": length,
        "staleness": integer_edges(0, max_staleness),
    }


def histogram(values: Iterable[float], edges: list[float]) -> HistogramSummary:
    """Counts of `values` per bucket [edges[i], edges[i+1]); the last bucket includes its upper edge, values
    below/above the edges count in the first/last bucket, NaN is not counted."""
    n = len(edges) - 1
    counts = [0] * n
    for v in values:
        if v != v:  # NaN
            continue
        counts[min(max(bisect_right(edges, v) - 1, 0), n - 1)] += 1
    return {"edges": list(edges), "counts": counts}


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """Group-normalised advantages in plain Python, the same formula as `trainer.algorithm.group_advantages`
    (checked against it by a test), so the driver needs no tensor to report them."""
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def step_histograms(groups: list[Group], *, version: int, edges: dict[str, list[float]]) -> dict[str, HistogramSummary]:
    """The four distributions of the samples in `groups`, trained into `version` (staleness as in the train
    event's `staleness_max`: version - 1 - the group's oldest token version)."""
    rewards: list[float] = []
    advantages: list[float] = []
    lengths: list[float] = []
    staleness: list[float] = []
    for g in groups:
        rewards += g.rewards
        advantages += group_advantages(g.rewards)
        lengths += [sum(row.mask) for row in g.rows]  # each row's generated tokens
        staleness += [version - 1 - g.min_version] * len(g.rewards)
    values = {"reward": rewards, "advantage": advantages, "response_length": lengths, "staleness": staleness}
    return {key: histogram(values[key], edges[key]) for key in HISTOGRAM_KEYS}
