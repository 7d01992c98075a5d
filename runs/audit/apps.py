from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit log is an app of its own, like runs/idempotency: its table has no foreign keys into runs, so a
    row outlives the run, schedule, token or user it names."""

    name = "runs.audit"
    label = "audit"
    verbose_name = "Audit log"
