"""OpenAPI shapes of the concurrency settings (GET/PATCH/PUT /api/settings/concurrency/): the slot policy with
each class's fair-share, bounded-waiting (runs/slots/fairness.py) and preemption options (preempt_policy.py), the
per-user caps and time limits. The services validate (messages name the field); these document the shapes."""

from __future__ import annotations

from rest_framework import serializers

from runs.api.serializers import ClassPolicySerializer, PolicySerializer, per_class
from runs.slots.user_limits import LIMIT_RULES


class ClassFairnessSerializer(serializers.Serializer):
    fair_share = serializers.BooleanField(help_text="order waiting runs by owner's decayed usage (false: FIFO)")
    max_running_per_user = serializers.IntegerField(allow_null=True, help_text="held runs per owner; null: none")
    aging_per_hour = serializers.IntegerField(help_text="priority points a waiting run gains per hour (0: off)")
    aging_cap = serializers.IntegerField(help_text="most priority points aging adds")
    max_wait_seconds = serializers.IntegerField(allow_null=True, help_text="overdue runs go first; null: off")


class ClassPreemptionSerializer(serializers.Serializer):
    preemptible = serializers.BooleanField(help_text="its held runs may be preempted (checkpoint, stop, requeue)")
    preempts = serializers.BooleanField(help_text="its waiting runs may preempt preemptible lower-priority runs")


class ClassQuotaSerializer(serializers.Serializer):
    team_quotas = serializers.DictField(
        child=serializers.IntegerField(), help_text="Django group name -> nominal slots of the class ({}: no quotas)"
    )
    team_borrowing_limit = serializers.IntegerField(
        allow_null=True, help_text="slots a team may hold above its quota when others are idle (null: no bound)"
    )


class ConcurrencyClassSerializer(
    ClassPolicySerializer, ClassFairnessSerializer, ClassPreemptionSerializer, ClassQuotaSerializer
):
    """A class's settings: its slot rules, its fair-share and bounded-waiting options, preemption, team quotas."""


LIMIT_HELP = {
    "max_queued_per_user": "queued runs one user may have; a submit past it is a 429",
    "max_running_per_user": "active (starting/running/stopping) runs one user may have when submitting; past "
    "it a submit is a 429",
    "default_time_limit_seconds": "time limit of a run submitted without one (at most max_time_limit_seconds)",
    "max_time_limit_seconds": "largest time_limit_seconds a submit may ask for",
}


PREEMPT_HELP = {
    "preempt_grace_seconds": "seconds a preempted run has to checkpoint and stop before it is stopped hard",
    "max_preemptions_per_run_per_day": "a run preempted this often in 24 h is not chosen again (0: never preempted)",
}


class ConcurrencySettingsSerializer(PolicySerializer):
    """Effective concurrency settings: the slot policy (with fair share and bounded waiting per class) plus the
    per-user caps and run time limits."""

    classes = per_class(ConcurrencyClassSerializer())
    fair_share_half_life_seconds = serializers.IntegerField(help_text="half-life of fair-share usage (> 0)")
    user_weights = serializers.DictField(child=serializers.IntegerField(), help_text="user id -> shares (1..1000)")
    preempt_grace_seconds = serializers.IntegerField(help_text=PREEMPT_HELP["preempt_grace_seconds"])
    max_preemptions_per_run_per_day = serializers.IntegerField(
        help_text=PREEMPT_HELP["max_preemptions_per_run_per_day"]
    )

    max_queued_per_user = serializers.IntegerField(help_text=LIMIT_HELP["max_queued_per_user"])
    max_running_per_user = serializers.IntegerField(help_text=LIMIT_HELP["max_running_per_user"])
    default_time_limit_seconds = serializers.IntegerField(help_text=LIMIT_HELP["default_time_limit_seconds"])
    max_time_limit_seconds = serializers.IntegerField(help_text=LIMIT_HELP["max_time_limit_seconds"])


def _limit_input(key: str) -> serializers.IntegerField:
    low, high, default = LIMIT_RULES[key]
    return serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=low,
        max_value=high,
        help_text=f"{LIMIT_HELP[key]}; default {default}; null resets to the default",
    )


class ConcurrencySettingsInputSerializer(serializers.Serializer):
    """Documentation of the accepted body; validation is done by the services so messages name the field."""

    max_total = serializers.IntegerField(required=False, min_value=1, max_value=1000)
    interactive_reserve = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=1000)
    classes = serializers.DictField(
        child=serializers.DictField(child=serializers.JSONField(allow_null=True)),
        required=False,
        help_text="per class: limit (1..1000), priority (0..100), gpu_limit (0..1000 or null: no GPU limit), "
        "fair_share (bool), max_running_per_user (1..1000), aging_per_hour and aging_cap (0..100), "
        "max_wait_seconds (1..1e9), preemptible and preempts (bool), team_quotas ({group name: 0..1000 slots}, "
        "at most 100, the sum at most the class limit; replaced whole), team_borrowing_limit (0..1000 slots above "
        "a team's quota; absent or null: no bound, 0: no borrowing); null turns an option off",
    )
    fair_share_half_life_seconds = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    user_weights = serializers.DictField(child=serializers.IntegerField(min_value=1, max_value=1000), required=False)
    preempt_grace_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=3600, help_text=PREEMPT_HELP["preempt_grace_seconds"]
    )
    max_preemptions_per_run_per_day = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=1000, help_text="default 3"
    )
    max_queued_per_user = _limit_input("max_queued_per_user")
    max_running_per_user = _limit_input("max_running_per_user")
    default_time_limit_seconds = _limit_input("default_time_limit_seconds")
    max_time_limit_seconds = _limit_input("max_time_limit_seconds")
