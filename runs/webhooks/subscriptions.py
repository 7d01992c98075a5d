"""The writes behind the webhook API (runs/api/webhooks.py): a subscription created (its secret generated here,
returned once), changed, a test delivery stored. Who may do what: a user subscribes to their own runs (all, or
one); staff may subscribe to any run or to all runs (`all_runs`) and allow a private target (`allow_private`).
Every refusal is an InvalidInput naming the field."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from runs.errors import InvalidInput, LimitExceeded, NotAllowed
from runs.models import Run
from runs.webhooks.emit import deliveries_store
from runs.webhooks.models import Delivery, EventKind, MetricRule, Subscription
from runs.webhooks.rules import METRICS, OPS, RULES_MAX, WINDOW_MAX
from runs.webhooks.targets import TargetRefused, target_resolve

SUBSCRIBABLE = tuple(k for k in EventKind.values if k not in (EventKind.TEST, EventKind.METRIC))


def url_check(url: Any, *, allow_private: bool) -> str:
    try:
        target_resolve(url, allow_private=allow_private or settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS)
    except TargetRefused as exc:
        raise InvalidInput(str(exc), field="url") from None
    return str(url)


def events_check(events: Any, *, has_rules: bool = False) -> list[str]:
    """The subscribed event kinds; empty only for a subscription with rules (told only of its alerts)."""
    if not isinstance(events, list) or not (events or has_rules) or not all(isinstance(e, str) for e in events):
        raise InvalidInput(f"must be a non-empty list of: {', '.join(SUBSCRIBABLE)}", field="events")
    unknown = sorted(set(events) - set(SUBSCRIBABLE))
    if unknown:
        raise InvalidInput(f"unknown {unknown[0]!r}; one of {', '.join(SUBSCRIBABLE)}", field="events")
    return sorted(set(events))


def rules_check(rules: Any) -> list[dict[str, Any]]:
    if not isinstance(rules, list) or len(rules) > RULES_MAX:
        raise InvalidInput(f"must be a list of at most {RULES_MAX} rules", field="rules")
    out = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or set(rule) - {"metric", "op", "threshold", "window"}:
            raise InvalidInput("must be {metric, op, threshold, window?}", field=f"rules[{i}]")
        if rule.get("metric") not in METRICS:
            raise InvalidInput(f"must be one of {', '.join(METRICS)}", field=f"rules[{i}].metric")
        if rule.get("op") not in OPS:
            raise InvalidInput(f"must be one of {', '.join(OPS)}", field=f"rules[{i}].op")
        threshold, window = rule.get("threshold"), rule.get("window", 0)
        if not isinstance(threshold, int | float) or isinstance(threshold, bool) or abs(threshold) > 1e12:
            raise InvalidInput("must be a finite number", field=f"rules[{i}].threshold")
        if rule["op"] == "drop" and not 0 < threshold <= 1:
            raise InvalidInput("a drop's threshold is a fraction in (0, 1]", field=f"rules[{i}].threshold")
        low = 2 if rule["op"] == "drop" else 0
        if not isinstance(window, int) or isinstance(window, bool) or not low <= window <= WINDOW_MAX:
            raise InvalidInput(f"must be an integer in [{low}, {WINDOW_MAX}]", field=f"rules[{i}].window")
        out.append({"metric": rule["metric"], "op": rule["op"], "threshold": float(threshold), "window": window})
    return out


def _run_check(visible: QuerySet[Run], run_id: Any) -> int | None:
    """`visible`: the runs the caller may see (runs.core.visibility.visible_runs, which the caller applies: this
    package sits below runs.core, whose lifecycle tells it of moves)."""
    if run_id is None:
        return None
    if not isinstance(run_id, int) or isinstance(run_id, bool):
        raise InvalidInput("must be a run id", field="run")
    if not visible.filter(pk=run_id).exists():  # another user's run reads as no run
        raise InvalidInput(f"no run {run_id} of yours", field="run")
    return run_id


def subscription_create(*, user: Any, body: dict[str, Any], visible: QuerySet[Run]) -> Subscription:
    staff_only = [name for name in ("all_runs", "allow_private") if body.get(name)]
    if staff_only and not user.is_staff:
        raise NotAllowed("only staff may set it", field=staff_only[0])
    allow_private = bool(body.get("allow_private"))
    url = url_check(body.get("url"), allow_private=allow_private)
    rules = rules_check(body.get("rules", []))
    events = events_check(body.get("events"), has_rules=bool(rules))
    run_id = _run_check(visible, body.get("run"))
    if run_id is not None and body.get("all_runs"):
        raise InvalidInput("a subscription is for one run or for all runs", field="all_runs")
    with transaction.atomic():
        if Subscription.objects.select_for_update().filter(owner=user).count() >= settings.WEBHOOKS_MAX_PER_USER:
            raise LimitExceeded(f"at most {settings.WEBHOOKS_MAX_PER_USER} webhooks per user", field="webhooks")
        sub = Subscription.objects.create(
            owner=user,
            url=url,
            events=events,
            run_id=run_id,
            all_runs=bool(body.get("all_runs")),
            allow_private=allow_private,
            secret=secrets.token_hex(32),
        )
        MetricRule.objects.bulk_create([MetricRule(subscription=sub, **rule) for rule in rules])
    return sub


def subscription_update(*, sub: Subscription, body: dict[str, Any]) -> Subscription:
    """PATCH: url, events, active, rules (all replaced); scope, secret and allowances stay."""
    unknown = sorted(set(body) - {"url", "events", "active", "rules"})
    if unknown:
        raise InvalidInput("cannot be changed (url, events, active and rules can)", field=unknown[0])
    with transaction.atomic():
        if "url" in body:
            sub.url = url_check(body["url"], allow_private=sub.allow_private and sub.owner.is_staff)
        if "events" in body:
            has_rules = bool(body["rules"]) if "rules" in body else sub.rules.exists()
            sub.events = events_check(body["events"], has_rules=has_rules)
        if "active" in body:
            if not isinstance(body["active"], bool):
                raise InvalidInput("must be true or false", field="active")
            sub.active = body["active"]
        sub.save()
        if "rules" in body:
            rules = rules_check(body["rules"])
            sub.rules.all().delete()
            MetricRule.objects.bulk_create([MetricRule(subscription=sub, **rule) for rule in rules])
    return sub


def test_send(sub: Subscription) -> Delivery:
    """A `test` delivery to the subscription (of no run), sent like any other."""
    with transaction.atomic():
        now = timezone.now()
        return deliveries_store([sub], event=EventKind.TEST, run_id=None, data={"test": True}, at=now)[0]
