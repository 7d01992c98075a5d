"""Metric rules: a subscription's `metric` (a `train` event's field: `reward_mean` or `exact_match`) `above` or
`below` a threshold, or a relative `drop` of at least `threshold` (0.2 = 20 %) from the highest of the last
`window` values to the newest. A rule fires once when it becomes crossed (not again while it stays crossed) and
re-arms when it uncrosses; its state per run is a RuleState row. Evaluated at ingest, in the batch's transaction
under the run's row lock (runs/webhooks/emit.py), so a crossing is told by the batch that crossed it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from runs.models import RunEvent
from runs.webhooks.models import RuleState, Subscription

METRICS = ("reward_mean", "exact_match")
OPS = ("above", "below", "drop")
WINDOW_MAX = 1000
RULES_MAX = 10  # per subscription


def rule_step(op: str, threshold: float, window: int, recent: list[float], value: float) -> tuple[bool, list[float]]:
    """(crossed now, the recent values to keep) after `value`."""
    if op == "above":
        return value > threshold, []
    if op == "below":
        return value < threshold, []
    kept = [*recent, value][-max(window, 2) :]
    peak = max(kept)
    crossed = len(kept) >= 2 and peak > 0 and (peak - value) / peak >= threshold
    return crossed, kept


def rules_apply(
    *, run_id: int, subscriptions: Sequence[Subscription], stored: Sequence[RunEvent]
) -> Iterator[tuple[Subscription, dict[str, Any], datetime]]:
    """The (subscription, alert data, time) of each rule the batch's train events newly cross, states saved."""
    trains = [e for e in stored if e.type == "train" and isinstance(e.data, dict)]
    if not trains:
        return
    for subscription in subscriptions:
        for rule in subscription.rules.all():
            state, _ = RuleState.objects.get_or_create(rule=rule, run_id=run_id)
            crossed, recent, fired = state.crossed, list(state.recent), []
            for event in trains:
                value = event.data.get(rule.metric)
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                now_crossed, recent = rule_step(rule.op, rule.threshold, rule.window, recent, float(value))
                if now_crossed and not crossed:
                    data = {"rule": rule.pk, "metric": rule.metric, "op": rule.op, "threshold": rule.threshold}
                    fired.append(({**data, "window": rule.window, "value": value, "seq": event.seq}, event.ts))
                crossed = now_crossed
            if crossed != state.crossed or recent != state.recent:
                RuleState.objects.filter(pk=state.pk).update(crossed=crossed, recent=recent)
            for data, at in fired:
                yield subscription, data, at
