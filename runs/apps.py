from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Runs and slots"

    def ready(self) -> None:
        # Run kinds executed on Ray (launch/stop hooks) and the platform's own `eval` kind.
        from runs.system_runs import execution_register

        execution_register()
