#!/usr/bin/env python
"""Django's command-line entry point for the control plane."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not os.environ.get("DJANGO_SECRET_KEY"):
        # A checkout where `make run` ran: its generated key (var/secret-key, or PLATFORM_VAR_DIR's), so that
        # createsuperuser, shell, ... work on the embedded database (var/db.sqlite3, the settings' default) as
        # the platform's own processes do. Without one, the settings' check refuses as before.
        from config.env import embedded_secret_key

        if key := embedded_secret_key():
            os.environ["DJANGO_SECRET_KEY"] = key
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
