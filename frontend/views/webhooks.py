"""The webhooks page (/webhooks/): the signed-in user's subscriptions, each with its latest deliveries and their
attempts, and a "Send test" button (a plain POST form: works without JavaScript). Only the user's own
subscriptions: another's id on the send-test form is a 404. Subscribing is done through the API
(POST /api/webhooks/: the secret is shown once, to the client that made it); docs/api.md, "Webhooks"."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs.webhooks.models import Delivery, Subscription
from runs.webhooks.subscriptions import test_send

DELIVERIES_SHOWN = 10


@login_required
def webhooks_page(request: HttpRequest) -> HttpResponse:
    subs = list(Subscription.objects.filter(owner_id=request.user.pk).prefetch_related("rules"))
    for sub in subs:
        latest = Delivery.objects.filter(subscription=sub).prefetch_related(Prefetch("attempt_log"))
        sub.latest = list(latest[:DELIVERIES_SHOWN])  # type: ignore[attr-defined]
    return render(request, "frontend/webhooks.html", {"subscriptions": subs, "nav": "webhooks"})


@login_required
@require_POST
def webhook_send_test(request: HttpRequest, webhook_id: int) -> HttpResponse:
    sub = Subscription.objects.filter(pk=webhook_id, owner_id=request.user.pk).first()
    if sub is None:
        raise Http404("no such webhook")
    delivery = test_send(sub)
    messages.success(request, f"Test delivery {delivery.pk} queued.")
    return redirect("webhooks")
