"""ServerSessions (trainer/agent_episodes.py), a rollout worker's sessions on the session server, against a plain
async stand-in for the server actor: sessions are opened ahead in batches, handed out once each, and ended in
shared calls that return each caller its own records."""

from __future__ import annotations

import asyncio

import pytest

from trainer.agent_episodes import POOL_SESSIONS, ServerSessions


class Server:
    """Records every open_sessions and end_many call; refuses an id opened twice, as the real server does."""

    def __init__(self) -> None:
        self.open: set[str] = set()
        self.opens: list[list[str]] = []
        self.ends: list[list[list[str]]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def open_sessions(self, sids: list[str]) -> None:
        if self.open & set(sids):
            raise ValueError("already exists")
        self.opens.append(list(sids))
        self.open |= set(sids)

    async def end_many(self, groups: list[list[str]]) -> list[object]:
        self.ends.append([list(g) for g in groups])
        await self.release.wait()
        out: list[object] = []
        for sids in groups:
            if not set(sids) <= self.open:
                out.append(KeyError(sids[0]))
                continue
            self.open -= set(sids)
            out.append([f"record of {s}" for s in sids])
        return out


def test_concurrent_groups_share_one_open_call_and_never_share_a_session() -> None:
    async def main() -> tuple[Server, list[list[str]]]:
        server = Server()
        pool = ServerSessions(server, "w0")
        taken = await asyncio.gather(*(pool.take(8) for _ in range(10)))  # 80 sessions
        return server, list(taken)

    server, taken = asyncio.run(main())
    flat = [s for group in taken for s in group]
    assert len(flat) == len(set(flat)) == 80
    assert all(s.startswith("w0-") for s in flat)
    assert [len(o) for o in server.opens] == [POOL_SESSIONS] * 3  # 80 sessions: three refills of 32
    assert set(flat) <= server.open


def test_a_group_larger_than_the_pool_gets_all_its_sessions_in_one_open() -> None:
    async def main() -> tuple[Server, list[str]]:
        server = Server()
        return server, await ServerSessions(server, "w1").take(POOL_SESSIONS + 5)

    server, taken = asyncio.run(main())
    assert len(taken) == POOL_SESSIONS + 5 and [len(o) for o in server.opens] == [POOL_SESSIONS + 5]


def test_two_pools_of_one_worker_name_never_collide() -> None:
    async def main() -> list[str]:
        server = Server()
        a, b = ServerSessions(server, "w0"), ServerSessions(server, "w0")  # a restarted worker, same name
        return await a.take(3) + await b.take(3)

    got = asyncio.run(main())
    assert len(set(got)) == 6


def test_ends_in_flight_hold_the_next_ones_which_then_share_a_call_and_each_gets_its_records() -> None:
    async def main() -> tuple[Server, list[list[str]], list[object]]:
        server = Server()
        pool = ServerSessions(server, "w0")
        groups = [await pool.take(2) for _ in range(4)]
        server.release.clear()
        first = asyncio.ensure_future(pool.end(groups[0]))
        await asyncio.sleep(0.01)  # in flight
        rest = [asyncio.ensure_future(pool.end(g)) for g in groups[1:]]
        bad = asyncio.ensure_future(pool.end(["never-opened"]))
        await asyncio.sleep(0.01)
        server.release.set()
        got = await asyncio.gather(first, *rest, bad, return_exceptions=True)
        return server, groups, list(got)

    server, groups, got = asyncio.run(main())
    assert len(server.ends) == 2 and len(server.ends[1]) == 4  # three groups and the bad one shared one call
    assert got[:4] == [[f"record of {s}" for s in g] for g in groups]  # each its own records, in order
    assert isinstance(got[4], KeyError)  # only the bad group failed


@pytest.mark.parametrize("k", [0, -1])
def test_take_needs_a_positive_count(k: int) -> None:
    async def main() -> list[str]:
        return await ServerSessions(Server(), "w0").take(k)

    with pytest.raises(ValueError, match="at least one session"):
        asyncio.run(main())
