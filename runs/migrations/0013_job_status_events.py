"""A job's own reports of its state are stored as `job_status` events from now on (runs/core/events.py
`stored_type`), so a stored `status` event is always one of the platform's moves and a run's `status` events are
a path of runs.core.lifecycle.TRANSITIONS. Rows stored before: every `status` event a job posted (any source other
than `platform`: the platform writes its moves under that source only) is renamed, so an old run's page, trace
and eval summary read as a new one's. The reverse renames them back for the code before this migration."""

from django.db import migrations

PLATFORM_SOURCE = "platform"  # runs.core.events.PLATFORM_SOURCE, as of this migration


def job_reports_renamed(apps, schema_editor):
    RunEvent = apps.get_model("runs", "RunEvent")
    RunEvent.objects.filter(type="status").exclude(source=PLATFORM_SOURCE).update(type="job_status")


def job_reports_restored(apps, schema_editor):
    RunEvent = apps.get_model("runs", "RunEvent")
    RunEvent.objects.filter(type="job_status").update(type="status")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_run_serving_url"),
    ]

    operations = [migrations.RunPython(job_reports_renamed, job_reports_restored)]
