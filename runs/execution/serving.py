"""Where a run's session server listens, as the platform keeps it: the job's `serving` event
(trainer/lifecycle_schema.py ServingData: `http://<ip>:<port>`) is vetted at ingest, and the latest vetted URL is
the run's `serving_url`, which the proxy (runs/api/proxy.py) forwards to. Cleared by the job's final report of its
state (its session server stops next), and when the attempt ends (runs.core.lifecycle.stamp).

Vetting is what keeps the proxy from being pointed at an arbitrary internal address: the host must be an IP
address of an alive node of the platform's Ray cluster (a ClusterNode row the tick read from Ray) or loopback,
and the port an unprivileged one. A URL that fails loses its `url` (the event is stored without it, a warning is
logged) and the run's serving URL is left as it was: like a `resources` claim on an unknown node
(runs/telemetry/ingest_validate.py), refusing the whole batch would stall the run's other events. docs/security.md,
"Reaching a run's policy".
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any
from urllib.parse import urlsplit

from runs.core.events import JOB_STATUS
from runs.models import FINISHED_STATUSES, ClusterNode

PORT_MIN = 1024  # no well-known service (ssh, http, smtp...) of a node can be a session server
log = logging.getLogger(__name__)


def serving_host(url: str) -> str | None:
    """The IP address a serving URL names, normalized (`10.0.0.1`, `::1`), or None when the URL is not
    `http://<ip>:<port>` with PORT_MIN <= port <= 65535 and nothing else."""
    try:
        parts = urlsplit(url)
        port = parts.port
        host = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        return None
    if parts.scheme != "http" or parts.username or parts.password or parts.query or parts.fragment:
        return None
    if parts.path not in ("", "/") or port is None or not PORT_MIN <= port <= 65535:
        return None
    return str(host)


def serving_url_allowed(url: str, node_addresses: set[str]) -> bool:
    """Whether the proxy may forward to `url`: a well-formed serving URL whose host is loopback or one of
    `node_addresses` (the alive Ray nodes' IP addresses)."""
    host = serving_host(url)
    if host is None:
        return False
    return ipaddress.ip_address(host).is_loopback or host in node_addresses


def node_addresses() -> set[str]:
    """The IP addresses of the alive nodes the tick last read from Ray, normalized as serving_host does."""
    out = set()
    for address in ClusterNode.objects.filter(alive=True).exclude(address="").values_list("address", flat=True):
        try:
            out.add(str(ipaddress.ip_address(address)))
        except ValueError:
            continue
    return out


def serving_events_vet(items: list[dict[str, Any]]) -> None:
    """Drop the `url` of every `serving` event whose host is not allowed (one query per batch that has one)."""
    serving = [item for item in items if item["type"] == "serving" and "url" in item["data"]]
    if not serving:
        return
    nodes = node_addresses()
    for item in serving:
        if not serving_url_allowed(item["data"]["url"], nodes):
            log.warning(
                "run event seq %s: serving URL %r refused (not a Ray node or loopback)",
                item["source_seq"],
                item["data"]["url"][:80],
            )
            item["data"] = {k: v for k, v in item["data"].items() if k != "url"}


def serving_url_latest(items: list[dict[str, Any]]) -> str | None:
    """The run's serving URL after the batch: the URL of its last vetted `serving` event, or "" when the job's
    final report of its state (a `status` event, `job_status` once vetted: succeeded, failed or cancelled) comes
    after it: a job that succeeds or is cancelled posts that report before it stops its session server
    (trainer/loop.py), so the proxy stops forwarding first, even to a `stopping` run, which the platform finishes
    only once its job has ended. None when the batch has neither."""
    for item in reversed(items):
        if item["type"] == JOB_STATUS and item["data"].get("status") in FINISHED_STATUSES:
            return ""
        if item["type"] == "serving" and isinstance(item["data"].get("url"), str):
            return item["data"]["url"].rstrip("/")
    return None
