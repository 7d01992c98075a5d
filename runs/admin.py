"""Django admin: cron schedules (staff define them here or through /api/schedules/), and read-only views of
runs, slots, events, the stored concurrency settings (state changes go through runs.core.lifecycle and
runs.scheduling.concurrency) and the outbox's effects (what each move still had to cause, and what became of it).
The pages that write (schedules, knox's API tokens) write their audit rows too (runs/audit/)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from knox.admin import AuthTokenAdmin
from knox.models import AuthToken

from runs.audit.models import Action
from runs.audit.record import TOKEN_PREFIX_LENGTH, actor_from_request, audit_record
from runs.errors import ServiceError
from runs.execution.schedules import cron_next, cron_problem, schedule_audited, schedule_check, schedule_fields
from runs.models import ConcurrencySettings, Run, RunEvent, Schedule, Slot
from runs.outbox.models import Effect


class ScheduleForm(forms.ModelForm):
    """The same check as POST /api/schedules/ (runs.execution.schedules.schedule_check: name, cron, kind config, and the
    kind's permission check for the chosen owner), each refusal shown on the field it names."""

    class Meta:
        model = Schedule
        fields = ["name", "cron", "kind", "config", "owner", "enabled"]

    def clean_cron(self) -> str:
        cron = self.cleaned_data["cron"]
        if problem := cron_problem(cron):
            raise forms.ValidationError(problem)
        return cron

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # ModelForm.clean returns cleaned_data
        if self.errors or data.get("owner") is None:
            return data  # a field already refused (or no owner): its message is shown, nothing to check yet
        fields = {key: data.get(key) for key in ("name", "cron", "kind", "config", "enabled")}
        try:
            data["config"] = schedule_check(owner=data["owner"], fields=fields)["config"]
        except ServiceError as exc:
            top = (exc.field or "").split(".")[0]
            self.add_error(top if top in self.fields else None, str(exc))
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ["id", "name", "cron", "kind", "owner", "enabled", "next_run_at", "last_run"]
    list_filter = ["enabled", "kind"]
    readonly_fields = ["next_run_at", "last_run", "created_at"]

    # The admin writes schedules itself, so it writes their audit rows too, in the same transaction.
    def save_model(self, request, obj: Schedule, form, change: bool) -> None:
        if not change or {"cron", "enabled"} & set(form.changed_data):
            obj.next_run_at = cron_next(obj.cron, after=timezone.now())
        with transaction.atomic():
            before = schedule_fields(Schedule.objects.select_for_update().get(pk=obj.pk)) if change else None
            super().save_model(request, obj, form, change)
            action = Action.SCHEDULE_UPDATE if change else Action.SCHEDULE_CREATE
            schedule_audited(actor_from_request(request), action, obj, before=before)

    def delete_model(self, request, obj: Schedule) -> None:
        with transaction.atomic():
            schedule_audited(actor_from_request(request), Action.SCHEDULE_DELETE, obj, before=schedule_fields(obj))
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset: QuerySet[Schedule]) -> None:
        with transaction.atomic():
            for schedule in queryset:
                self.delete_model(request, schedule)


admin.site.unregister(AuthToken)  # knox registers it; ours is the same page, audited


@admin.register(AuthToken)
class AuditedAuthTokenAdmin(AuthTokenAdmin):
    """knox's token pages write tokens themselves, so they write the token.* audit rows of runs/auth/tokens.py."""

    def save_model(self, request, obj: AuthToken, form, change: bool) -> None:
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if not change:
                after = {"user": obj.user.get_username()}
                prefix = obj.token_key[:TOKEN_PREFIX_LENGTH]
                audit_record(
                    actor_from_request(request), Action.TOKEN_CREATE, target_type="token", target_id=prefix, after=after
                )

    def delete_model(self, request, obj: AuthToken) -> None:
        with transaction.atomic():
            prefix, before = obj.token_key[:TOKEN_PREFIX_LENGTH], {"user": obj.user.get_username()}
            audit_record(
                actor_from_request(request),
                Action.TOKEN_REVOKE,
                target_type="token",
                target_id=prefix,
                before=before | {"tokens": [prefix]},
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset: QuerySet[AuthToken]) -> None:
        with transaction.atomic():
            for token in queryset:
                self.delete_model(request, token)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "owner", "origin", "run_class", "kind", "status", "created_at", "granted_at")
    list_filter = ("status", "run_class", "kind")
    search_fields = ("name", "owner__username")
    # The nonce is an input of the run's ingest token (with SECRET_KEY): no page shows it.
    exclude = ("ingest_nonce",)


@admin.register(Slot)
class SlotAdmin(ReadOnlyAdmin):
    list_display = ("run", "run_class", "state", "requested_at", "granted_at")
    list_filter = ("state", "run_class")


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("run", "seq", "type", "source", "source_seq", "ts")
    list_filter = ("type",)


@admin.register(ConcurrencySettings)
class ConcurrencySettingsAdmin(ReadOnlyAdmin):
    list_display = ("id", "raw", "updated_at", "updated_by")


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "key", "state", "attempts", "next_attempt_at", "outcome", "created_at", "done_at")
    list_filter = ("state", "kind")
    search_fields = ("key",)
