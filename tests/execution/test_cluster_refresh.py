"""`manage.py cluster_refresh` against the shared Ray cluster: what `make run` does before anything grants. A
node of a previous Ray head (a new head is a new node) is marked lost, the live ones are recorded; with Ray not
answering the command fails and leaves the nodes as they were."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from runs.models import ClusterNode
from tests.conftest import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_previous_heads_node_is_lost_and_the_live_ones_are_recorded(ray_settings, capsys):
    ClusterNode.objects.create(
        node_id="previous-head", alive=True, total={"CPU": 2, "GPU": 0, "memory": 1 << 34}, seen_at=timezone.now()
    )
    before = set(ClusterNode.objects.values_list("node_id", flat=True))  # with the suite's stand-in node
    call_command("cluster_refresh")
    nodes = dict(ClusterNode.objects.values_list("node_id", "alive"))
    assert not any(nodes[n] for n in before)  # Ray does not list them: lost
    live = {n for n, alive in nodes.items() if alive}
    assert live and not live & before  # the cluster's own nodes, recorded alive
    assert capsys.readouterr().out.strip() == f"{len(live)} alive Ray node(s)"
    assert all(n.total["CPU"] > 0 for n in ClusterNode.objects.filter(alive=True))  # what grants charge against


def test_ray_not_answering_fails_and_changes_no_node(settings):
    settings.RAY_ADDRESS = f"http://127.0.0.1:{free_port()}"
    ClusterNode.objects.create(node_id="kept", alive=True, total={"CPU": 2}, seen_at=timezone.now())
    before = sorted(ClusterNode.objects.values_list("node_id", "alive", "seen_at"))
    with pytest.raises(CommandError, match="Ray is not reachable"):
        call_command("cluster_refresh")
    assert sorted(ClusterNode.objects.values_list("node_id", "alive", "seen_at")) == before
