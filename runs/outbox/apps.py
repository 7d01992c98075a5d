from django.apps import AppConfig


class OutboxConfig(AppConfig):
    """The outbox's table (runs/outbox/models.py) is an app of its own so that runs/models.py stays one page."""

    name = "runs.outbox"
    label = "outbox"
    verbose_name = "After-commit effects"
