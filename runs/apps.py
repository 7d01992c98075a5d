from django.apps import AppConfig


class RunsConfig(AppConfig):
    """The run kinds are a static registry (runs/execution/kinds.py): nothing is registered at start-up."""

    name = "runs"
    verbose_name = "Runs and slots"
