"""`manage.py cluster_refresh`: read the Ray cluster's nodes into the database once, as the tick does.

The embedded run command (platform/up.py) runs it once Ray answers and before the tick and the worker start: a
new local Ray head is a new node, and the rows of the previous one would otherwise stay alive until the first
tick, so the first grants would place runs on a node that is gone (their requeue follows at that tick). Exits 1
when Ray does not answer (nothing is written but the cluster's status).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from runs.execution.capacity import cluster_refresh
from runs.models import ClusterNode


class Command(BaseCommand):
    help = "Read the Ray cluster's nodes (alive, lost, resources) into the database once."

    def handle(self, *args: Any, **options: Any) -> None:
        if not cluster_refresh(now=timezone.now()):
            raise CommandError("Ray is not reachable: nodes not refreshed")
        alive = ClusterNode.objects.filter(alive=True).count()
        self.stdout.write(f"{alive} alive Ray node(s)")
