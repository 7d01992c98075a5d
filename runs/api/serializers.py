"""Small input/output serializers of the REST API (shapes of ARCHITECTURE.md section 4)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.execution.kinds import DEFAULT_KIND
from runs.models import Origin, Run
from runs.scheduling.queue import QueueInfo
from runs.selectors import run_json
from runs.slots.grant import PENDING_REASONS
from runs.slots.policy import CLASSES


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanField(serializers.JSONField):
    """A JSON boolean and nothing else ("true", 1 are refused by the services with a message naming the field)."""


class RunSubmitSerializer(serializers.Serializer):
    # Plain fields: origin/kind/config are validated by the services so the 400 names the field exactly.
    name = serializers.CharField(max_length=200)
    origin = serializers.CharField(
        required=False,
        allow_null=True,
        help_text=f"{' | '.join(Origin.values)}. Omitted: earned from how the request came in (browser session: "
        "dashboard; API token: api). Non-staff users may only send the origin they earn (else 403); "
        "staff may send any.",
    )
    kind = serializers.CharField(default=DEFAULT_KIND, help_text="a registered run kind")
    config = serializers.JSONField(default=dict, help_text="validated against the kind's schema")
    time_limit_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=10**9,
        help_text="seconds from the grant; omitted: the staff default (default_time_limit_seconds); above "
        "max_time_limit_seconds: 400",
    )
    # DRF-stubs type JSONField's default as a mapping; any JSON value is a valid default.
    auto_resume = StrictBooleanField(
        default=False,  # type: ignore[arg-type]
        help_text="true: if the run fails, resume it from its last checkpoint",
    )


class RunResumeInputSerializer(serializers.Serializer):
    # DRF-stubs type JSONField's default as a mapping; any JSON value is a valid default.
    from_scratch = StrictBooleanField(
        default=False,  # type: ignore[arg-type]
        help_text="true: start over from step 0 (needed when the run has no checkpoint: 409 `no_checkpoint`); "
        "omitted or false: continue from its latest checkpoint",
    )


class PositionSerializer(serializers.Serializer):
    in_class = serializers.IntegerField()
    overall = serializers.IntegerField()


# A `starting` run's pending reason (stored on the run by the job's `resources` events).
STARTING_REASONS = ("waiting_for_resources", "starting_processes")


class RunSerializer(serializers.ModelSerializer):
    """Run JSON; `position` and `eta_seconds` are null unless the run is queued; `pending_reason` and
    `pending_detail` are set for a queued run, and for a `starting` run whose placement group waits or whose
    processes start.

    The fields document the schema; the JSON itself is runs.selectors.run_json, the one builder the
    websockets use too."""

    owner = serializers.CharField(source="owner.username", read_only=True)
    cancelled_by = serializers.CharField(allow_null=True, help_text="who last cancelled it (audit log), or null")
    resumed_by = serializers.CharField(allow_null=True, help_text="who last resumed it (audit log), or null")
    queued_seconds = serializers.FloatField()
    position = PositionSerializer(allow_null=True)
    pending_reason = serializers.ChoiceField(choices=PENDING_REASONS + STARTING_REASONS, allow_null=True)
    pending_detail = serializers.JSONField(
        allow_null=True,
        help_text="insufficient_resources: {needs, free, largest_free_node[, message]} (Ray units); "
        "gpu_limit_reached: {gpu_limit, held_gpus}; a starting run: {message}",
    )
    eta_seconds = serializers.FloatField(allow_null=True)
    progress = serializers.FloatField(
        allow_null=True, help_text="steps done / steps total (0..1); null before the run's first train event"
    )
    eta_finish_seconds = serializers.FloatField(
        allow_null=True,
        help_text="a running run: seconds until it is predicted to finish (steps left / recent step rate, capped "
        "by its time limits); null otherwise or before a step rate is known",
    )
    config = serializers.JSONField()
    summary = serializers.JSONField()
    resources = serializers.JSONField(
        allow_null=True,
        help_text="the run's demand, derived from kind and config at submit: {bundles: [{role, CPU, GPU, memory}], "
        "total: {CPU, GPU, memory}, strategy}",
    )

    preempted_by = serializers.IntegerField(
        allow_null=True, help_text="the run its latest preemption made room for (null: never preempted)"
    )
    preempt_state = serializers.CharField(
        help_text="its latest preemption: '' (never), requested (checkpointing and stopping), preempted (queued, "
        "resumes from its checkpoint when granted), resumed"
    )
    preempt_reason = serializers.CharField(help_text="why it was preempted ('' when never)")

    class Meta:
        model = Run
        fields = [
            "id",
            "name",
            "origin",
            "run_class",
            "kind",
            "status",
            "owner",
            "cancelled_by",
            "resumed_by",
            "config",
            "created_at",
            "granted_at",
            "started_at",
            "finished_at",
            "queued_seconds",
            "position",
            "pending_reason",
            "pending_detail",
            "eta_seconds",
            "progress",
            "eta_finish_seconds",
            "error",
            "summary",
            "auto_resume",
            "time_limit_seconds",
            "resources",
            "preempted_by",
            "preempt_state",
            "preempt_reason",
        ]
        read_only_fields = fields

    def to_representation(self, run: Run) -> dict[str, Any]:
        info: QueueInfo | None = (self.context.get("queue_info") or {}).get(run.pk)
        return dict(run_json(run, info, self.context.get("paces")))


class RunPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RunSerializer(many=True)


class RunEventSerializer(serializers.Serializer):
    run = serializers.IntegerField(source="run_id")
    seq = serializers.IntegerField()
    ts = serializers.SerializerMethodField()
    type = serializers.CharField()
    # The metaclass moves declared fields out of the class, so this does not shadow Serializer.data.
    data = serializers.JSONField()  # type: ignore[assignment]

    @extend_schema_field(serializers.FloatField())
    def get_ts(self, event: Any) -> float:
        return event.ts.timestamp()


class ClassPolicySerializer(serializers.Serializer):
    limit = serializers.IntegerField()
    priority = serializers.IntegerField()
    gpu_limit = serializers.IntegerField(allow_null=True, help_text="GPUs the class may hold at once; null: no limit")


def per_class(child: serializers.Serializer) -> serializers.Serializer:
    return type(
        "PerClass" + child.__class__.__name__, (serializers.Serializer,), {k: child.__class__() for k in CLASSES}
    )()


class PolicySerializer(serializers.Serializer):
    """Effective slot policy (what the grant uses)."""

    max_total = serializers.IntegerField()
    interactive_reserve = serializers.IntegerField()
    classes = per_class(ClassPolicySerializer())


class ClassUsageSerializer(serializers.Serializer):
    running = serializers.IntegerField()
    waiting = serializers.IntegerField()
    limit = serializers.IntegerField()
    priority = serializers.IntegerField()
    gpu_limit = serializers.IntegerField(allow_null=True)
    gpus = serializers.FloatField(help_text="GPUs the class's held runs hold")


class TotalUsageSerializer(serializers.Serializer):
    running = serializers.IntegerField()
    max_total = serializers.IntegerField()


class SlotsSnapshotSerializer(serializers.Serializer):
    policy = PolicySerializer()
    borrowable = serializers.IntegerField()
    classes = per_class(ClassUsageSerializer())
    total = TotalUsageSerializer()


class DryRunInputSerializer(serializers.Serializer):
    origin = serializers.CharField(help_text="dashboard | api | schedule | system")
    kind = serializers.CharField(required=False, help_text="with config: the phantom run has this run's demand")
    config = serializers.JSONField(required=False, help_text="the run config (validated like a submit)")
    time_limit_seconds = serializers.IntegerField(required=False, allow_null=True)


class RunResourcesInputSerializer(serializers.Serializer):
    kind = serializers.CharField(required=False, default=DEFAULT_KIND)
    config = serializers.JSONField(help_text="the run config, validated like a submit")


class RunResourcesSerializer(serializers.Serializer):
    """A run's demand, as stored in Run.resources at submit."""

    bundles = serializers.ListField(child=serializers.JSONField())
    total = serializers.JSONField()
    strategy = serializers.CharField()
    fits = serializers.BooleanField(help_text="false: submit would refuse it (it can never fit the alive cluster)")
    problem = serializers.CharField(allow_null=True, help_text="why it can never fit; null when it can")


class DryRunSerializer(serializers.Serializer):
    origin = serializers.CharField()
    run_class = serializers.CharField()
    granted = serializers.BooleanField()
    pending_reason = serializers.ChoiceField(choices=PENDING_REASONS, allow_null=True)
    pending_detail = serializers.JSONField(allow_null=True)
    would_preempt = serializers.ListField(
        child=serializers.DictField(),
        help_text="a class that preempts: the runs that would be preempted for it now, [{run, run_class, reason}]",
    )


class ErrorSerializer(serializers.Serializer):
    """Every error answer: a readable message naming the field, the field's dotted name (null if none), and
    for request-body validation the full per-field detail."""

    detail = serializers.CharField()
    field = serializers.CharField(allow_null=True, required=False)
    code = serializers.CharField(
        required=False, help_text="a machine-readable reason, when one applies (e.g. no_checkpoint)"
    )
    # The metaclass moves declared fields out of the class, so this does not shadow Serializer.errors.
    errors = serializers.JSONField(required=False)  # type: ignore[assignment]


class TokenInputSerializer(serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField()


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField()
