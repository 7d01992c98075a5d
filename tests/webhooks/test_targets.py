"""The SSRF rule: hostile URLs refused at subscribe time with a 400 naming `url`, private targets only when staff
allow them, and a delivery whose target turned private since (or was never checked) refused before connecting."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from runs.webhooks.models import Attempt, Delivery, DeliveryState, Subscription
from runs.webhooks.targets import TargetRefused, address_refused, target_resolve
from runs.webhooks.tasks import deliver_once

pytestmark = pytest.mark.django_db

HOSTILE = [
    "file:///etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://example.com/",
    "http://127.0.0.1:8000/api/",
    "http://[::1]/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/",
    "http://192.168.0.1/",
    "http://[::ffff:127.0.0.1]/",
    "http://[fe80::1]/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://localhost:6379/",  # a name resolving to loopback
    "http://user:pw@example.com/",
    "http://exa mple.com/",
    "http:///nohost",
    "javascript:alert(1)",
    "",
]


@pytest.mark.parametrize("url", HOSTILE)
def test_hostile_urls_are_refused_naming_url(user, url, settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    client = APIClient()
    client.force_authenticate(user)
    answer = client.post("/api/webhooks/", {"url": url, "events": ["run.status"]}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["field"] == "url"
    assert not Subscription.objects.exists()


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "private"),
        ("::1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("169.254.169.254", "private"),
        ("fe80::1", "private"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "private"),
        ("100.64.0.1", "not global"),
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
    ],
)
def test_address_rule(address, why):
    assert address_refused(address) == why


def test_loopback_allowed_only_when_staff_allow_it(settings):
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    with pytest.raises(TargetRefused):
        target_resolve("http://127.0.0.1:9/", allow_private=False)
    assert target_resolve("http://127.0.0.1:9/x?a=1", allow_private=True).path == "/x?a=1"


def test_a_delivery_checks_its_target_again(user, staff, receiver, settings, handed):
    """A subscription made while private targets were allowed is refused at delivery once they are not: no
    request reaches the receiver, the attempt is logged, the delivery failed. A staff `allow_private` one goes."""
    settings.WEBHOOKS_ALLOW_PRIVATE_TARGETS = False
    plain = Subscription.objects.create(owner=user, url=receiver.url, events=["run.status"], secret="s" * 64)
    allowed = Subscription.objects.create(
        owner=staff, url=receiver.url, events=["run.status"], secret="t" * 64, allow_private=True
    )
    now = timezone.now()
    refused = Delivery.objects.create(subscription=plain, event="test", at=now)
    sent = Delivery.objects.create(subscription=allowed, event="test", at=now)
    assert deliver_once(str(refused.pk)) == ("failed", 1)
    assert receiver.requests == []
    attempt = Attempt.objects.get(delivery=refused)
    assert attempt.status_code is None and attempt.error.startswith("target refused")
    assert Delivery.objects.get(pk=refused.pk).state == DeliveryState.FAILED
    assert deliver_once(str(sent.pk)) == ("delivered", 1)
    assert len(receiver.accepted()) == 1


def test_a_receiver_that_trickles_its_answer_is_cut_off(user, private_ok, monkeypatch):
    """A hostile receiver sending its answer a byte at a time (each read within the read timeout) cannot hold a
    worker past the attempt's total timeout, nor is a redirect followed."""
    import socket
    import threading
    import time

    from runs.webhooks import send

    monkeypatch.setattr(send, "TOTAL_TIMEOUT_S", 1.0)
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/\r\n" * 100:
            if stop.is_set():
                break
            try:
                conn.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
        conn.close()

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    target = target_resolve(f"http://127.0.0.1:{server.getsockname()[1]}/", allow_private=True)
    started = time.monotonic()
    answer = send.post(target, secret="s", delivery_id="d", body=b"{}")
    stop.set()
    server.close()
    assert time.monotonic() - started < 3
    assert not answer.accepted and answer.status_code in (None, 302)  # cut off mid-headers; the 302 not followed
