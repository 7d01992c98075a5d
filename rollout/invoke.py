"""Call a method the same way on a Ray actor handle, an async object or a plain object (Ray at the edge)."""

from __future__ import annotations

import inspect
from typing import Any


def is_ray_actor(handle: Any) -> bool:
    """True for a Ray actor handle; never imports Ray when the caller does not use it."""
    cls = type(handle)
    return cls.__name__ == "ActorHandle" and cls.__module__.startswith("ray.")


async def call(handle: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    """`await call(h, "seal")` runs `h.seal.remote()` on an actor, awaits a coroutine, or returns a value."""
    fn = getattr(handle, method)
    if is_ray_actor(handle):
        return await fn.remote(*args, **kwargs)
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result
