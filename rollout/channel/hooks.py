"""Channel hooks: a Collector reshapes, weighs and counts items on the way in; selectable by name.

(There were Dispatchers too, which dealt items to the private queues of named consumers. The training run has
one consumer, its learner, so nothing used them; they were removed. docs/rollout.md "Channel".)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rollout.errors import ChannelError


@dataclass(frozen=True)
class ChannelContext:
    """What a hook learns about its channel, once, in setup()."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    cfg: Any = None


class Collector:
    """Transforms items on the way into the channel; the base class passes them through unchanged."""

    def setup(self, ctx: ChannelContext) -> None:
        self.ctx = ctx

    def collect(self, item: Any, key: str) -> Iterable[tuple[Any, ...]]:
        """Yield (key, item) or (key, item, weight): nothing drops the item, several fan it out."""
        yield key, item

    def metrics(self) -> dict[str, float]:
        """What this collector counted, by name (Channel.metrics reports it; the base counts nothing)."""
        return {}


_COLLECTORS: dict[str, type[Collector]] = {}


def register_collector(name: str) -> Callable[[type[Collector]], type[Collector]]:
    def deco(cls: type[Collector]) -> type[Collector]:
        _COLLECTORS[name] = cls
        return cls

    return deco


@register_collector("identity")
class IdentityCollector(Collector):
    pass


@register_collector("split")
class SplitCollector(Collector):
    """Fans a list/tuple out into its elements (each queued on its own, same key)."""

    def collect(self, item: Any, key: str) -> Iterable[tuple[Any, ...]]:
        if isinstance(item, (list, tuple)):
            for element in item:
                yield key, element
        else:
            yield key, item


def resolve_hook(spec: Any, ctx: ChannelContext) -> Collector:
    """A collector from a registered name, a 'module:Class' path, a class or an instance; setup() is called."""
    if spec is None:
        hook = Collector()
    elif isinstance(spec, str):
        if spec in _COLLECTORS:
            hook = _COLLECTORS[spec]()
        elif ":" in spec:
            module, _, attr = spec.partition(":")
            try:
                hook = getattr(importlib.import_module(module), attr)()
            except (ImportError, AttributeError) as exc:
                raise ChannelError(f"collector {spec!r} cannot be imported: {exc}") from exc
        else:
            known = sorted(_COLLECTORS)
            raise ChannelError(f"unknown collector {spec!r}: registered are {known}; or give 'module:Class'")
    elif isinstance(spec, type):
        hook = spec()
    else:
        hook = spec
    if not isinstance(hook, Collector):
        raise ChannelError(f"collector {spec!r} is not a Collector")
    hook.setup(ctx)
    return hook
