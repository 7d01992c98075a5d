"""`manage.py platform_admin --password P`: make sure a superuser exists and print its login and API token.

Used by the embedded run command (platform/up.py). Prints one JSON line:
`{"username", "created", "token"}` (+ `"password"` when it created the user with the given password).
"""
from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from runs.api.tokens import token_issue


class Command(BaseCommand):
    help = "Create an admin user if no superuser exists; print its username and API token as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password", required=True, help="password for the admin if it is created")

    def handle(self, *args: Any, username: str, password: str, **options: Any) -> None:
        User = get_user_model()
        admin = User.objects.filter(is_superuser=True).order_by("id").first()
        created = admin is None
        if created:
            admin = User.objects.create_superuser(username=username, email="", password=password)
        token = token_issue(admin)  # a fresh one if the stored one has expired
        out: dict[str, Any] = {"username": admin.get_username(), "created": created, "token": token.key}
        if created:
            out["password"] = password
        self.stdout.write(json.dumps(out))
