"""The dashboard's webhooks page: the user's own subscriptions and deliveries only, every value escaped, and
"Send test" a CSRF-protected POST that queues a test delivery (another user's id: 404)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from runs.webhooks.models import Attempt, Delivery, Subscription

pytestmark = pytest.mark.django_db

HOSTILE = '<script>alert("x")</script>'


def test_the_page_lists_only_mine_escaped(user, other_user):
    mine = Subscription.objects.create(
        owner=user, url=f"http://example.com/{HOSTILE}", events=["run.status"], secret="s3cr3t-never-shown"
    )
    Subscription.objects.create(
        owner=other_user, url="http://example.com/bobs-secret-hook", events=["run.status"], secret="b"
    )
    delivery = Delivery.objects.create(subscription=mine, event="test", at=timezone.now())
    Attempt.objects.create(delivery=delivery, at=timezone.now(), error=f"ConnectionError: {HOSTILE}", latency_ms=3.0)
    client = Client()
    client.force_login(user)
    page = client.get("/webhooks/")
    assert page.status_code == 200
    html = page.content.decode()
    assert HOSTILE not in html and "&lt;script&gt;" in html
    assert "bobs-secret-hook" not in html and str(delivery.pk) in html
    assert mine.secret not in html  # the secret is never rendered


def test_send_test_is_a_csrf_post_for_the_owner_only(user, other_user, handed, django_capture_on_commit_callbacks):
    sub = Subscription.objects.create(owner=user, url="http://example.com/h", events=["run.status"], secret="a")
    bob = Client(enforce_csrf_checks=True)
    bob.force_login(other_user)
    page = bob.get("/webhooks/")
    token = page.cookies["csrftoken"].value if "csrftoken" in page.cookies else ""
    assert bob.post(f"/webhooks/{sub.pk}/test/", {"csrfmiddlewaretoken": token}).status_code == 404
    alice = Client(enforce_csrf_checks=True)
    alice.force_login(user)
    assert alice.post(f"/webhooks/{sub.pk}/test/").status_code == 403  # no CSRF token
    alice.get("/webhooks/")
    with django_capture_on_commit_callbacks(execute=True):
        sent = alice.post(f"/webhooks/{sub.pk}/test/", {"csrfmiddlewaretoken": alice.cookies["csrftoken"].value})
    assert sent.status_code == 302
    assert Delivery.objects.filter(subscription=sub, event="test").count() == 1 and len(handed) == 1
    assert alice.get(f"/webhooks/{sub.pk}/test/").status_code == 405
