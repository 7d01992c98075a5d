"""`manage.py platform_admin`: make sure a superuser exists and print its login and API token.

Used by the embedded run command (platform/up.py). The password for a new admin comes from the environment
(PLATFORM_ADMIN_PASSWORD), never from argv, where every user of the machine could read it. Prints one JSON line:
`{"username", "created", "token"}` (+ `"password"` when it created the user with the given password).
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.auth.tokens import token_issue


class Command(BaseCommand):
    help = "Create an admin user if no superuser exists; print its username and API token as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        password = os.environ.get("PLATFORM_ADMIN_PASSWORD", "")
        User = get_user_model()
        admin = User.objects.filter(is_superuser=True).order_by("id").first()
        created = admin is None
        if admin is None:
            if not password:
                raise CommandError("set PLATFORM_ADMIN_PASSWORD to the password for the new admin")
            admin = User.objects.create_superuser(username=username, email="", password=password)
        token = token_issue(admin)  # a new one each start: only its digest is stored, so an old one can't be shown
        out: dict[str, Any] = {"username": admin.get_username(), "created": created, "token": token}
        if created:
            out["password"] = password
        self.stdout.write(json.dumps(out))
