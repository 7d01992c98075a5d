"""API tokens moved to django-rest-knox, which stores only a SHA-512 digest of each (runs/auth/tokens.py). The old
`rest_framework.authtoken` table held every key in clear: it is dropped with its rows, and with the app's
migration records and content type, so nothing readable is left behind. Holders of an old token sign in again
(POST /api/auth/token/): hashing the old keys into knox rows would have kept alive keys that sat in clear in
this database and its backups (docs/security.md, "API tokens")."""

from django.db import migrations


def drop_plaintext_tokens(apps, schema_editor):
    if "authtoken_token" in schema_editor.connection.introspection.table_names():
        schema_editor.execute("DROP TABLE authtoken_token")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")
    apps.get_model("contenttypes", "ContentType").objects.filter(app_label="authtoken").delete()  # + permissions


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0010_run_redundant_indexes"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [migrations.RunPython(drop_plaintext_tokens, migrations.RunPython.noop)]
