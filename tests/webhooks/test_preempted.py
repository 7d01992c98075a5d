"""`run.preempted`: a preemption is told once, when the victim is back in the queue (checkpointed, or stopped hard
after its grace period), as one delivery with its outbox effect stored in that transaction, to the subscriptions
that ask for it and cover the run: its owner's, never another user's nor one that did not ask. Against the
database DATABASE_URL names (SQLite and PostgreSQL) with real commits; the preemption is driven as
tests/runs/test_preempt_db.py drives it, the deliveries are POSTed to a real local receiver."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs.execution import preempt
from runs.execution.outcome import run_job_finished
from runs.models import RunStatus
from runs.outbox.models import Effect
from runs.webhooks.models import Delivery, Subscription
from runs.webhooks.tasks import deliver_once
from tests.runs.helpers import _fresh_policy_cache  # noqa: F401 - autouse: no policy cached from another test
from tests.runs.test_admission_db import nodes, submit
from tests.runs.test_preempt_db import configure, fresh, running
from tests.webhooks.receiver import Receiver, payload, signature_valid

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: the effects drain after them


def subscribe(owner, url: str, events: list[str], **fields) -> Subscription:
    return Subscription.objects.create(owner=owner, url=url, events=events, secret="k" * 64, **fields)


@pytest.fixture
def scene(user, other_user, handoffs, private_ok, handed):
    """Alice's two preemptible schedule runs fill both slots, her interactive run waits; subscriptions: hers to
    `run.preempted` (all her runs, and the victim alone), hers to checkpoints only, Bob's to `run.preempted`."""
    mine, theirs = Receiver(failures=1), Receiver()
    nodes(a=(2, 0))
    configure()
    running(user, "old", checkpoint=2, step=5)
    victim = running(user, "new", checkpoint=9, step=12)  # the most recent checkpoint: chosen
    waiting = submit(user, name="interactive", origin="dashboard", cpus=1.0)
    assert waiting.status == RunStatus.QUEUED
    subs = {
        "all": subscribe(user, mine.url, ["run.preempted", "run.checkpoint"]),
        "one": subscribe(user, mine.url, ["run.preempted"], run=victim),
        "unasked": subscribe(user, theirs.url, ["run.checkpoint"]),
        "bob": subscribe(other_user, theirs.url, ["run.preempted"]),
    }
    yield victim, waiting, subs, mine, theirs, handed
    mine.close()
    theirs.close()


def told(handed: list[str], subs: dict[str, Subscription]) -> list[tuple[str, str]]:
    names = {s.pk: name for name, s in subs.items()}
    return sorted((names[d.subscription_id], d.event) for d in Delivery.objects.filter(pk__in=handed))


def test_a_checkpointed_preemption_is_told_once_to_the_owners_subscriptions_that_ask(scene):
    victim, waiting, subs, mine, theirs, handed = scene
    assert preempt.preemptions_request() == [victim.pk]
    assert handed == [] and not Delivery.objects.exists()  # asked to stop: not preempted yet
    run_job_finished(run=fresh(victim), status=RunStatus.FAILED, error="Ray job was stopped outside the platform")
    assert fresh(victim).status == RunStatus.QUEUED and fresh(waiting).status == RunStatus.STARTING
    assert told(handed, subs) == [("all", "run.preempted"), ("one", "run.preempted")]
    assert Delivery.objects.count() == 2 and Effect.objects.filter(kind="webhook", state="done").count() == 2
    assert not preempt.preempt_requeue(run=fresh(victim))  # told again by a late report: nothing more
    assert preempt.preemptions_overdue(now=timezone.now() + timedelta(seconds=61)) == []
    assert Delivery.objects.count() == 2 and len(handed) == 2

    for delivery_id in handed:  # the receiver fails each first attempt: retried under the same delivery id
        assert [deliver_once(delivery_id)[0] for _ in range(3)] == ["retry", "delivered", "skipped"]
    accepted = mine.wait_accepted(2)
    assert len(accepted) == 2 and sorted(r["headers"]["X-RLCP-Delivery"] for r in accepted) == sorted(handed)
    assert all(signature_valid(r, subs["all"].secret) for r in mine.requests)
    body = payload(accepted[0])
    assert body["event"] == "run.preempted" and body["run"] == victim.pk
    assert body["data"] == {
        "preempted_by": waiting.pk,
        "reason": fresh(victim).preempt_reason,
        "outcome": "checkpointed",
        "hard_stopped": False,
        "step": 12,
        "checkpoint_step": 9,
        "lost_steps": 3,  # the platform knew step 12; the job's last checkpoint it was told of is 9
    }
    assert theirs.requests == []


def test_a_hard_stop_is_told_once_with_the_work_lost(scene):
    victim, waiting, subs, mine, theirs, handed = scene
    asked = timezone.now() - timedelta(seconds=61)  # asked a grace period (60 s) ago: overdue now
    assert preempt.preemptions_request(now=asked) == [victim.pk]
    assert preempt.preemptions_overdue() == [victim.pk]
    assert preempt.preemptions_overdue() == []
    assert not preempt.preempt_requeue(run=fresh(victim), hard=True)  # closed: nothing more to tell
    assert told(handed, subs) == [("all", "run.preempted"), ("one", "run.preempted")]
    assert Delivery.objects.count() == 2
    data = Delivery.objects.get(subscription=subs["one"]).data
    assert (data["hard_stopped"], data["outcome"], data["checkpoint_step"], data["lost_steps"]) == (
        True,
        "stopped_hard",
        9,
        3,
    )
    assert data["preempted_by"] == waiting.pk
    assert [deliver_once(handed[0])[0] for _ in range(2)] == ["retry", "delivered"]
    assert len(mine.accepted()) == 1 and theirs.requests == []
