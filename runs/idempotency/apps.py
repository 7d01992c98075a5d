from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    """The keys' table (runs/idempotency/models.py) is an app of its own so that runs/models.py stays one page."""

    name = "runs.idempotency"
    label = "idempotency"
    verbose_name = "Idempotency keys"
