"""ChannelActor: a ChannelState served by a named, async Ray actor, so producers and consumers in other processes
share it; `spawn` starts one under its channel's name and `find` looks one up (what Channel.create/connect call).

Plain class; `ray.remote` is applied in `spawn` and Ray is imported only there and in `find` (Ray stays at the edge).
"""

from __future__ import annotations

from typing import Any

from rollout.channel import ops
from rollout.channel.state import DEFAULT_KEY, ChannelState, Entry
from rollout.errors import ChannelError

_ACTOR_PREFIX = "rollout-channel:"
# What the actor reserves unless the caller says otherwise (`actor_options`: resources, a placement-group
# scheduling strategy): it queues items between processes and runs the collector, so a small share of one CPU.
DEFAULT_NUM_CPUS = 0.05


class ChannelActor:
    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.state = ChannelState(name, **kwargs)

    async def put(self, entries: list[Entry], key: str, timeout: float | None, nowait: bool) -> int:
        return await ops.put_waiting(self.state, entries, key, timeout, nowait)

    async def take(
        self,
        key: str,
        target_weight: float | None,
        max_items: int,
        timeout: float | None,
        nowait: bool,
    ) -> tuple[int, list[Any]]:
        return await ops.take_waiting(self.state, key, target_weight, max_items, timeout, nowait)

    async def qsize(self, key: str) -> int:
        return self.state.qsize(key)

    async def maxsize(self) -> int:
        return self.state.maxsize

    async def full(self, key: str) -> bool:
        return self.state.full(key)

    async def metrics(self) -> dict[str, float]:
        return self.state.metrics()

    async def describe(self) -> str:
        return self.state.describe()

    async def close(self) -> None:
        self.state.close()


def spawn(name: str, kwargs: dict[str, Any], namespace: str | None, actor_options: dict[str, Any] | None) -> Any:
    """Start the named actor of channel `name` (ChannelState arguments `kwargs`) and wait until it answers.
    `actor_options` are Ray actor options laid over the defaults (e.g. num_cpus, memory, scheduling_strategy)."""
    import ray

    options: dict[str, Any] = {"name": _ACTOR_PREFIX + name, "num_cpus": DEFAULT_NUM_CPUS, "max_concurrency": 1000}
    if namespace is not None:
        options["namespace"] = namespace
    options.update(actor_options or {})
    # Any: Ray types a handle's methods as the plain class's, which have no `.remote`.
    actor: Any = ray.remote(ChannelActor).options(**options).remote(name, kwargs)
    ray.get(actor.qsize.remote(DEFAULT_KEY))  # surface hook/config errors now, not on first put
    return actor


def find(name: str, namespace: str | None) -> Any:
    """The handle of channel `name`'s actor; ChannelError if there is none."""
    import ray

    try:
        return ray.get_actor(_ACTOR_PREFIX + name, namespace=namespace)
    except ValueError as exc:
        raise ChannelError(f"no channel named {name!r} (create it first)") from exc
