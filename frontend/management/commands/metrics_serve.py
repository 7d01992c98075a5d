"""`python manage.py metrics_serve [--addr A] [--port P]`: the metrics on a port of their own (no auth: bind it
where only Prometheus reaches, e.g. a private interface). Defaults: METRICS_ADDR and METRICS_PORT."""

from __future__ import annotations

from typing import Any
from wsgiref.simple_server import make_server

from django.conf import settings
from django.core.management.base import BaseCommand
from prometheus_client import make_wsgi_app

from frontend.metrics import REGISTRY


class Command(BaseCommand):
    help = "Serve the Prometheus metrics on a separate address and port (no authentication)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--addr", default=getattr(settings, "METRICS_ADDR", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=getattr(settings, "METRICS_PORT", 9464))

    def handle(self, *args: Any, addr: str, port: int, **options: Any) -> None:
        server = make_server(addr, port, make_wsgi_app(REGISTRY))
        self.stdout.write(f"metrics on http://{addr}:{port}/metrics")
        server.serve_forever()
