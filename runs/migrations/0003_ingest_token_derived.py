"""Ingest tokens are no longer stored: drop the plaintext `ingest_token` column and give every run a random
`ingest_nonce`, from which (with SECRET_KEY, run id and attempt) its token is derived (runs.models).

Existing tokens are invalidated, not carried over: a job still running across this migration gets 401 on its
event posts, stops heartbeating and is failed by the tick after SLOTS_HEARTBEAT_TIMEOUT_SECONDS (resume it to
continue from its checkpoint with a token of the new kind). Migrate with no run active (docs/operations.md).
"""

import secrets

from django.db import migrations, models

import runs.models


def nonce_per_run(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    for run_id in Run.objects.values_list("pk", flat=True).iterator():
        Run.objects.filter(pk=run_id).update(ingest_nonce=secrets.token_hex(16))


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_run_granted_at_index"),
    ]

    operations = [
        migrations.RemoveField(model_name="run", name="ingest_token"),
        migrations.AddField(
            model_name="run",
            name="ingest_nonce",
            field=models.CharField(default=runs.models.new_ingest_nonce, max_length=64),
        ),
        # AddField evaluates a callable default once for all existing rows: give each its own.
        migrations.RunPython(nonce_per_run, migrations.RunPython.noop),
    ]
