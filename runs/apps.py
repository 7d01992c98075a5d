from django.apps import AppConfig


class RunsConfig(AppConfig):
    """The run kinds are a static registry (runs/execution/kinds.py): nothing is registered at start-up. The one
    wiring done here: the dashboard publisher (runs/core/publish.py, called by the writers) gets its sender
    (runs/telemetry/realtime.py, the readers above them), so that no writer imports the readers."""

    name = "runs"
    verbose_name = "Runs and slots"

    def ready(self) -> None:
        from runs.core import publish
        from runs.telemetry import realtime

        publish.dashboard_sender_install(realtime)
