"""Websocket consumers through config.asgi.application (WebsocketCommunicator, real Redis layer, real PG)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from runs.core.publish import run_group
from runs.models import Run, RunEvent
from runs.telemetry.ingest import run_events_ingest
from tests.realtime.conftest import communicator, gate, run_async, run_make, train, user_make
from tests.wait import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 30  # seconds; generous because the shared 2-core machine is sometimes far overloaded


def ingest(run: Run, events: list[dict]) -> None:
    run_events_ingest(run=Run.objects.get(pk=run.pk), payload=events)


async def close_code(path: str, user) -> int:
    comm = communicator(path, user)
    connected, _ = await comm.connect(timeout=WAIT)
    assert connected
    message = await comm.receive_output(timeout=WAIT)
    await comm.disconnect(timeout=WAIT)
    assert message["type"] == "websocket.close"
    return message["code"]


async def receive_seqs(comm, until: int, timeout: float = WAIT) -> list[int]:
    seqs: list[int] = []
    deadline = time.monotonic() + timeout
    while not seqs or seqs[-1] < until:
        message = await comm.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        assert message["type"] == "events", message
        seqs += [e["seq"] for e in message["events"]]
    return seqs


def test_authentication_and_permission_close_codes():
    owner, other, staff = user_make("o"), user_make("x"), user_make("s", staff=True)
    run = run_make(owner)
    assert run_async(close_code, f"/ws/runs/{run.pk}/", None) == 4401
    assert run_async(close_code, "/ws/dashboard/", None) == 4401
    # Another user's run and a missing run close alike: the code does not reveal which ids exist.
    assert run_async(close_code, f"/ws/runs/{run.pk}/", other) == 4403
    assert run_async(close_code, f"/ws/runs/{run.pk + 1000}/", other) == 4403
    assert run_async(close_code, "/ws/runs/999999/", staff) == 4403
    assert run_async(close_code, f"/ws/runs/{run.pk}/?after=abc", owner) == 4400
    assert run_async(close_code, f"/ws/runs/{run.pk}/?after=5", owner) == 4400  # beyond the stream


def test_snapshot_then_live_events_then_exact_replay_on_reconnect():
    owner, staff = user_make("o"), user_make("s", staff=True)
    run = run_make(owner)
    ingest(run, [gate(1), train(2, 1)])

    async def scenario():
        comm = communicator(f"/ws/runs/{run.pk}/", staff)
        assert (await comm.connect(timeout=WAIT))[0]
        snap = await comm.receive_json_from(timeout=WAIT)
        assert snap["type"] == "snapshot" and snap["last_seq"] == 2
        assert snap["run"]["id"] == run.pk and snap["run"]["summary"]["train"]["step"] == 1
        await sync_to_async(ingest)(run, [train(3, 2), train(4, 3)])
        live = await comm.receive_json_from(timeout=WAIT)
        assert live == {
            "type": "events",
            "events": [
                {"run": run.pk, "seq": 3, "ts": live["events"][0]["ts"], "type": "train", "data": train(3, 2)["data"]},
                {"run": run.pk, "seq": 4, "ts": live["events"][1]["ts"], "type": "train", "data": train(4, 3)["data"]},
            ],
        }
        await comm.disconnect(timeout=WAIT)
        await sync_to_async(ingest)(run, [train(5, 4)])  # missed while away
        again = communicator(f"/ws/runs/{run.pk}/?after=3", owner)
        assert (await again.connect(timeout=WAIT))[0]
        assert (await again.receive_json_from(timeout=WAIT))["last_seq"] == 5
        assert await receive_seqs(again, 5) == [4, 5]
        await sync_to_async(ingest)(run, [train(6, 5)])
        assert await receive_seqs(again, 6) == [6]
        assert await again.receive_nothing(timeout=0.3)
        await again.disconnect(timeout=WAIT)

    run_async(scenario)


def test_replay_racing_a_live_stream_has_no_gap_and_no_duplicate():
    owner = user_make("o")
    run = run_make(owner)
    total, burst = 120, 12
    done = threading.Event()
    connections: list[int] = []  # the last seq each connection asked for, appended once its snapshot came
    writer_errors: list[BaseException] = []

    def writer():
        from django.db import connection

        try:
            for seq in range(1, total + 1):
                # Each burst of commits starts once the reader has opened one more connection: every burst races
                # a fresh join + replay, however loaded the machine (a fixed pace could finish before the first).
                needed = 1 + (seq - 1) // burst
                wait_until(lambda n=needed: len(connections) >= n, timeout=WAIT, what=f"reader connection {needed}")
                ingest(run, [train(seq, seq)])
        except BaseException as exc:  # noqa: BLE001 - reported by the test's assertion
            writer_errors.append(exc)
        finally:
            connection.close()
            done.set()

    async def scenario():
        thread = threading.Thread(target=writer)
        thread.start()
        seen: list[int] = []
        give_up = time.monotonic() + 60
        while not (done.is_set() and seen[-1:] == [total]) and time.monotonic() < give_up:
            # Reconnect again and again with the last seq while the writer keeps committing and publishing.
            comm = communicator(f"/ws/runs/{run.pk}/?after={seen[-1] if seen else 0}", owner)
            assert (await comm.connect(timeout=WAIT))[0]
            assert (await comm.receive_json_from(timeout=WAIT))["type"] == "snapshot"
            connections.append(seen[-1] if seen else 0)
            window = time.monotonic() + 0.15
            while time.monotonic() < window:
                if not await comm.receive_nothing(timeout=0.02):
                    seen += [e["seq"] for e in (await comm.receive_json_from(timeout=WAIT))["events"]]
            await comm.disconnect(timeout=WAIT)
        await asyncio.to_thread(thread.join)
        return seen

    assert run_async(scenario) == list(range(1, total + 1)), writer_errors
    assert not writer_errors, writer_errors
    # The race happened: connections that resumed mid-stream (0 < after < total), one per burst at least.
    assert len([after for after in connections if 0 < after < total]) >= total // burst // 2, connections


def test_lost_live_message_is_filled_from_the_database():
    owner = user_make("o")
    run = run_make(owner)

    async def scenario():
        comm = communicator(f"/ws/runs/{run.pk}/", owner)
        assert (await comm.connect(timeout=WAIT))[0]
        await comm.receive_json_from(timeout=WAIT)
        # Store 1..3 without publishing (as if Redis were down), then a live message for 4 only.
        await sync_to_async(store_silently)(run, 3)
        event4 = await sync_to_async(store_silently)(run, 1)
        await get_channel_layer().group_send(run_group(run.pk), {"type": "run.events", "events": event4})
        assert await receive_seqs(comm, 4) == [1, 2, 3, 4]
        # Tail loss with no later message: the idle resync (0.5 s in tests) finds it.
        await sync_to_async(store_silently)(run, 2)
        assert await receive_seqs(comm, 6, timeout=WAIT) == [5, 6]
        await comm.disconnect(timeout=WAIT)

    run_async(scenario)


def store_silently(run: Run, count: int) -> list[dict]:
    from runs.core.events import run_event_to_dict

    last = Run.objects.get(pk=run.pk).last_seq
    rows = [
        RunEvent(
            run_id=run.pk,
            seq=last + i,
            source="test",
            source_seq=last + i,
            ts=run.created_at,
            type="log",
            data={"line": i},
        )
        for i in range(1, count + 1)
    ]
    RunEvent.objects.bulk_create(rows)
    Run.objects.filter(pk=run.pk).update(last_seq=last + count)
    return [run_event_to_dict(r) for r in rows]


def test_dashboard_snapshot_visibility_and_coalesced_run_updates():
    alice, bob, staff = user_make("alice"), user_make("bob"), user_make("s", staff=True)
    mine, theirs = run_make(alice, name="mine"), run_make(bob, name="theirs")

    async def scenario():
        comm = communicator("/ws/dashboard/", alice)
        assert (await comm.connect(timeout=WAIT))[0]
        snap = await comm.receive_json_from(timeout=WAIT)
        assert snap["type"] == "snapshot" and set(snap) == {"type", "slots", "cluster", "queue", "active"}
        assert [r["name"] for r in snap["active"]] == ["mine"]
        assert set(snap["slots"]) >= {"classes", "total"}
        started = time.monotonic()
        for step in range(1, 31):  # 30 ingests as fast as they go
            await sync_to_async(ingest)(mine, [train(step, step)])
            await sync_to_async(ingest)(theirs, [train(step, step)])
        elapsed = time.monotonic() - started
        updates = []
        while not await comm.receive_nothing(timeout=0.5):
            updates.append(await comm.receive_json_from(timeout=WAIT))
        await comm.disconnect(timeout=WAIT)
        return updates, elapsed

    updates, elapsed = run_async(scenario)
    assert {u["type"] for u in updates} == {"run"}
    assert {u["run"]["name"] for u in updates} == {"mine"}  # bob's run is not alice's business
    assert len(updates) <= elapsed / 0.1 + 2  # at most 10 per second per run (+ the trailing one)
    assert updates[-1]["run"]["summary"]["train"]["step"] == 30  # the latest state always arrives
    assert staff.is_staff


def test_dashboard_gets_status_changes_with_slots_and_queue_after_commit():
    from django.db import transaction

    from runs.core.publish import dashboard_publish

    alice, bob = user_make("alice"), user_make("bob")

    def change(run: Run, status: str) -> None:
        with transaction.atomic():
            Run.objects.filter(pk=run.pk).update(status=status, last_seq=run.last_seq + 1)
            run.last_seq += 1
            dashboard_publish({"kind": "run_status", "run": run.pk, "owner": run.owner_id, "status": status})

    async def drain(comm) -> list[dict]:
        messages = []
        while not await comm.receive_nothing(timeout=1.0):
            messages.append(await comm.receive_json_from(timeout=WAIT))
        return messages

    async def scenario():
        comm = communicator("/ws/dashboard/", alice)
        assert (await comm.connect(timeout=WAIT))[0]
        assert (await comm.receive_json_from(timeout=WAIT))["queue"] == []
        mine = await sync_to_async(run_make)(alice, status="queued", name="mine")
        theirs = await sync_to_async(run_make)(bob, status="queued", name="theirs")
        await sync_to_async(change)(mine, "queued")
        await sync_to_async(change)(theirs, "queued")
        got = await drain(comm)
        await sync_to_async(change)(mine, "starting")
        later = await drain(comm)
        await comm.disconnect(timeout=WAIT)
        return got, later

    got, later = run_async(scenario)
    runs = [m["run"] for m in got if m["type"] == "run"]
    slots = [m for m in got if m["type"] == "slots"]
    assert [(r["name"], r["status"]) for r in runs] == [("mine", "queued")]  # bob's run is not shown to alice
    # The queue travels as moves (tests/realtime/test_queue_frames.py), never as a list of runs.
    assert set(slots[-1]["queue"]) == {"joined", "left", "reasons", "rate", "finishes", "run_seconds"}
    assert len(slots) <= 2  # coalesced burst
    assert "theirs" not in str(slots)
    assert set(slots[-1]["slots"]) >= {"classes", "total"}
    assert [m["run"]["status"] for m in later if m["type"] == "run"] == ["starting"]
    assert [m for m in later if m["type"] == "slots"][-1]["queue"]["joined"] == []
