"""RequestGate rules: leases, receipts, seal/drain/install/reopen, fail-closed poison."""

import asyncio
import time

import pytest

from rollout.errors import (
    AdmissionTimeoutError,
    DrainTimeoutError,
    GatePoisonedError,
    GateStateError,
    RejectedBeforeGeneration,
    StaleVersionError,
)
from rollout.gate import GateState, RequestGate, SettlementReceipt, gate_event_data


def run(coro):
    return asyncio.run(coro)


async def publish(gate: RequestGate, version: int) -> None:
    gate.seal()
    await gate.drain(timeout_s=1.0)
    gate.install_version(version)
    gate.reopen()


def test_lease_completes_and_tags_version_and_request_id():
    async def main():
        gate = RequestGate("e0", version=3)
        async with gate.lease("s1", request_id="r1") as lease:
            assert (lease.version, lease.request_id, lease.session_id) == (3, "r1", "s1")
            assert gate.snapshot()["active"] == 1
        assert lease.receipt.outcome == "completed" and lease.receipt.safe
        snap = gate.snapshot()
        assert snap["state"] == "open" and snap["active"] == 0 and snap["failures"] == 0

    run(main())


def test_request_cancelled_mid_flight_poisons_and_blocks_next_install():
    async def main():
        gate = RequestGate("e0")
        started = asyncio.Event()

        async def request():
            async with gate.lease("s1"):
                started.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(request())
        await started.wait()
        gate.seal()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        snap = gate.snapshot()
        assert snap["state"] == "poisoned" and snap["failures"] == 1 and snap["active"] == 0
        assert "cancelled" in snap["poison_reason"]
        with pytest.raises(GatePoisonedError):
            await gate.drain(timeout_s=0.1)
        with pytest.raises(GatePoisonedError):
            gate.install_version(1)
        with pytest.raises(GatePoisonedError):
            gate.reopen()
        with pytest.raises(GatePoisonedError):
            await gate.acquire("s2", timeout=0.1)
        assert gate.version == 0
        # The owner resolves it; the gate stays closed until a full publication reopens it.
        assert "cancelled" in gate.reset("operator checked engine")
        assert gate.state is GateState.SEALED
        await gate.drain(timeout_s=0.1)
        gate.install_version(1)
        gate.reopen()
        assert gate.snapshot()["state"] == "open" and gate.version == 1

    run(main())


def test_drain_deadline_poisons_and_raises():
    async def main():
        gate = RequestGate("e0")
        lease = await gate.acquire("s1")
        gate.seal()
        with pytest.raises(DrainTimeoutError) as info:
            await gate.drain(timeout_s=0.05)
        assert isinstance(info.value, TimeoutError)
        assert gate.state is GateState.POISONED
        assert "drain deadline" in gate.snapshot()["poison_reason"]
        with pytest.raises(GatePoisonedError):
            gate.install_version(1)
        # Settling the straggler late does not un-poison.
        gate.settle(lease, SettlementReceipt.completed(lease))
        assert gate.state is GateState.POISONED

    run(main())


def test_drain_waits_for_active_leases_then_succeeds():
    async def main():
        gate = RequestGate("e0")
        lease = await gate.acquire("s1")
        gate.seal()
        drain = asyncio.create_task(gate.drain(timeout_s=2.0))
        await asyncio.sleep(0.02)
        assert gate.snapshot()["state"] == "draining" and not drain.done()
        lease.settle(SettlementReceipt.completed(lease))
        await drain
        assert gate.snapshot()["state"] == "sealed" and gate.snapshot()["drained"]

    run(main())


def test_install_refuses_stale_version_and_is_idempotent():
    async def main():
        gate = RequestGate("e0", version=5)
        with pytest.raises(GateStateError, match="seal"):
            gate.install_version(6)
        gate.seal()
        with pytest.raises(GateStateError, match="drain"):
            gate.install_version(6)
        await gate.drain(timeout_s=0.1)
        with pytest.raises(StaleVersionError):
            gate.install_version(5)
        with pytest.raises(StaleVersionError):
            gate.install_version(4)
        assert gate.install_version(6) is True
        assert gate.install_version(6) is False  # the same call repeated
        assert gate.snapshot()["state"] == "installing"
        with pytest.raises(GateStateError, match="already installing"):
            gate.install_version(7)  # a different version while installing is not a repeat
        gate.reopen()
        assert gate.version == 6 and gate.state is GateState.OPEN

    run(main())


def test_waiters_admitted_after_reopen_see_new_version():
    async def main():
        gate = RequestGate("e0", version=1)
        gate.seal()
        await gate.drain(timeout_s=0.1)
        waiters = [asyncio.create_task(gate.acquire(f"s{i}", timeout=2.0)) for i in range(5)]
        await asyncio.sleep(0.02)
        assert gate.snapshot()["waiting"] == 5
        gate.install_version(2)
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)  # installing still holds them
        gate.reopen()
        leases = await asyncio.gather(*waiters)
        assert [lease.version for lease in leases] == [2] * 5
        assert {lease.epoch for lease in leases} == {1}
        assert gate.snapshot()["waiting"] == 0 and gate.snapshot()["active"] == 5

    run(main())


def test_waiter_timeout_is_not_a_poison():
    async def main():
        gate = RequestGate("e0")
        gate.seal()
        with pytest.raises(AdmissionTimeoutError) as info:
            await gate.acquire("s1", timeout=0.03)
        assert isinstance(info.value, TimeoutError)
        assert gate.snapshot()["state"] == "sealed" and gate.snapshot()["waiting"] == 0

    run(main())


def test_poison_wakes_waiters_with_a_clear_error():
    async def main():
        gate = RequestGate("e0")
        lease = await gate.acquire("s1")
        gate.seal()
        waiter = asyncio.create_task(gate.acquire("s2", timeout=2.0))
        await asyncio.sleep(0.01)
        gate.settle(lease, SettlementReceipt.unknown(lease, "lost", "connection reset"))
        with pytest.raises(GatePoisonedError, match="connection reset"):
            await waiter

    run(main())


def test_rejection_before_generation_is_a_safe_failure():
    async def main():
        gate = RequestGate("e0")
        with pytest.raises(RejectedBeforeGeneration):
            async with gate.lease("s1"):
                raise RejectedBeforeGeneration("prompt of 9000 tokens exceeds context 8192")
        snap = gate.snapshot()
        assert snap["state"] == "open" and snap["safe_failures"] == 1 and snap["failures"] == 0
        gate.seal()
        await gate.drain(timeout_s=0.1)
        gate.install_version(1)

    run(main())


@pytest.mark.parametrize(
    "outcome,exc",
    [("timeout", TimeoutError("backend read timeout")), ("error", ConnectionResetError("lost connection"))],
)
def test_unknown_outcomes_poison(outcome, exc):
    async def main():
        gate = RequestGate("e0")
        with pytest.raises(type(exc)):
            async with gate.lease("s1"):
                raise exc
        assert gate.state is GateState.POISONED
        assert gate.snapshot()["recent_failures"][0]["outcome"] == outcome

    run(main())


def test_failed_record_poisons_and_settling_twice_is_noop():
    async def main():
        gate = RequestGate("e0")
        lease = await gate.acquire("s1")
        bad = SettlementReceipt(lease.request_id, "s1", 0, True, False, "record_failed", "trace store down")
        assert not bad.safe
        assert gate.settle(lease, bad) is bad
        assert gate.settle(lease, SettlementReceipt.completed(lease)) is bad
        assert gate.snapshot()["failures"] == 1 and gate.state is GateState.POISONED

    run(main())


def test_duplicate_request_id_rejected_and_recent_failures_bounded():
    async def main():
        gate = RequestGate("e0", max_failures_kept=3)
        await gate.acquire("s", request_id="r")
        with pytest.raises(GateStateError, match="already holds"):
            await gate.acquire("s", request_id="r")
        for _ in range(10):
            lease = gate._active.get("r") or await gate.acquire("s")
            gate.settle(lease, SettlementReceipt.unknown(lease, "lost"))
            gate.reset()
            gate.reopen()
        snap = gate.snapshot()
        assert snap["failures"] == 10 and len(snap["recent_failures"]) == 3

    run(main())


def test_concurrent_requests_through_three_publications_lose_nothing():
    async def main():
        gate = RequestGate("e0")
        seen: list[tuple[int, int]] = []

        async def client(i: int):
            for _turn in range(6):
                async with gate.lease(f"s{i}", timeout=5.0) as lease:
                    await asyncio.sleep(0.001 * (i % 3))
                    seen.append((i, lease.version))

        clients = asyncio.gather(*(client(i) for i in range(20)))
        for version in (1, 2, 3):
            await asyncio.sleep(0.005)
            await publish(gate, version)
        await clients
        assert len(seen) == 120
        assert gate.snapshot()["active"] == 0 and gate.state is GateState.OPEN and gate.version == 3
        # Versions never go backwards for one client.
        for i in range(20):
            versions = [v for c, v in seen if c == i]
            assert versions == sorted(versions)

    run(main())


def test_gate_event_data_folds_worst_state():
    snaps = [
        {"engine": "a", "state": "open", "version": 3, "active": 2, "waiting": 0},
        {"engine": "b", "state": "draining", "version": 2, "active": 1, "waiting": 4},
    ]
    data = gate_event_data(snaps)
    assert data == {"state": "draining", "version": 2, "active": 3, "waiting": 4, "engines": snaps}
    snaps.append({"engine": "c", "state": "poisoned", "version": 3, "active": 0, "waiting": 0})
    assert gate_event_data(snaps)["state"] == "poisoned"


# --- what each publication cost: leases drained, requests admitted at reopen -------------------------------
def test_drain_reports_the_three_leases_it_waited_for_even_when_repeated():
    async def main():
        gate = RequestGate("e0")
        leases = [await gate.acquire(f"s{i}") for i in range(3)]
        gate.seal()
        drain = asyncio.create_task(gate.drain(timeout_s=2.0))
        for lease in leases:
            await asyncio.sleep(0.005)
            assert not drain.done()  # it really waits for each of them
            lease.settle(SettlementReceipt.completed(lease))
        assert await drain == 3
        # A retried prepare drains again: the same closed window, the same leases waited for.
        assert await gate.drain(timeout_s=0.1) == 3
        gate.install_version(1)
        assert await gate.drain(timeout_s=0.1) == 3  # installing: drained before the install started
        assert gate.reopen() == 0  # nobody waited
        # The next publication starts from zero: nothing in flight, nothing to wait for.
        gate.seal()
        assert await gate.drain(timeout_s=0.1) == 0
        gate.install_version(2)
        assert gate.reopen() == 0

    run(main())


def test_only_leases_in_flight_when_the_drain_begins_are_counted():
    async def main():
        gate = RequestGate("e0")
        early, late = await gate.acquire("s0"), await gate.acquire("s1")
        gate.seal()
        early.settle(SettlementReceipt.completed(early))  # ended between seal and drain: not waited for
        drain = asyncio.create_task(gate.drain(timeout_s=2.0))
        await asyncio.sleep(0.01)
        late.settle(SettlementReceipt.completed(late))
        assert await drain == 1

    run(main())


def test_a_drain_cancelled_then_restarted_reports_its_window_once():
    async def main():
        gate = RequestGate("e0")
        leases = [await gate.acquire(f"s{i}") for i in range(2)]
        gate.seal()
        first = asyncio.create_task(gate.drain(timeout_s=2.0))
        await asyncio.sleep(0.01)
        leases[0].settle(SettlementReceipt.completed(leases[0]))
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        again = asyncio.create_task(gate.drain(timeout_s=2.0))
        await asyncio.sleep(0.01)
        leases[1].settle(SettlementReceipt.completed(leases[1]))
        assert await again == 2  # the window's two leases, not the one left when the second drain began

    run(main())


def test_two_requests_arriving_while_sealed_are_admitted_at_reopen_and_counted():
    async def main():
        gate = RequestGate("e0", version=1)
        gate.seal()
        assert await gate.drain(timeout_s=0.1) == 0  # nothing in flight: a drain of nothing says so
        waiters = [asyncio.create_task(gate.acquire(f"s{i}", timeout=2.0)) for i in range(2)]
        gave_up = asyncio.create_task(gate.acquire("impatient", timeout=0.01))
        with pytest.raises(AdmissionTimeoutError):
            await gave_up  # refused before the reopen: not admitted, not counted
        assert gate.snapshot()["waiting"] == 2
        gate.install_version(2)
        assert gate.reopen() == 2
        leases = await asyncio.gather(*waiters)
        assert [lease.version for lease in leases] == [2, 2]  # admitted under the new version
        assert gate.reopen() == 0  # already open: nothing more admitted

    run(main())


def test_a_waiter_whose_deadline_passes_as_the_gate_reopens_is_admitted():
    async def main():
        gate = RequestGate("e0")
        gate.seal()
        await gate.drain(timeout_s=0.1)
        waiter = asyncio.create_task(gate.acquire("s0", timeout=0.05))
        await asyncio.sleep(0.01)
        gate.install_version(1)
        assert gate.reopen() == 1
        time.sleep(0.06)  # blocks the loop: the waiter's deadline and its wake-up are both due now
        lease = await waiter  # reopen counted it as admitted: it is, not refused with a timeout
        assert lease.version == 1 and gate.snapshot()["active"] == 1

    run(main())
