"""Channel hooks: Collectors reshape items on the way in, Dispatchers pick the consumer; both selectable by name."""

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
    consumers: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    cfg: Any = None


class Collector:
    """Transforms items on the way into the channel; the base class passes them through unchanged."""

    def setup(self, ctx: ChannelContext) -> None:
        self.ctx = ctx

    def collect(self, item: Any, key: str) -> Iterable[tuple[Any, ...]]:
        """Yield (key, item) or (key, item, weight): nothing drops the item, several fan it out."""
        yield key, item


class Dispatcher:
    """Chooses the consumer of each item; the base class leaves every item in the key's shared queue."""

    def setup(self, ctx: ChannelContext) -> None:
        self.ctx = ctx

    @property
    def deals(self) -> bool:
        """True when route() is overridden: consumers then have private queues."""
        return type(self).route is not Dispatcher.route

    def route(self, item: Any, key: str) -> str | None:
        return None

    def rebalance(self, key: str, starved: str, depths: dict[str, int]) -> str | None:
        """For a blocking get on an empty private queue: the consumer to take one item from, or None to wait."""
        return None


_COLLECTORS: dict[str, type[Collector]] = {}
_DISPATCHERS: dict[str, type[Dispatcher]] = {}


def register_collector(name: str) -> Callable[[type[Collector]], type[Collector]]:
    def deco(cls: type[Collector]) -> type[Collector]:
        _COLLECTORS[name] = cls
        return cls

    return deco


def register_dispatcher(name: str) -> Callable[[type[Dispatcher]], type[Dispatcher]]:
    def deco(cls: type[Dispatcher]) -> type[Dispatcher]:
        _DISPATCHERS[name] = cls
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


@register_dispatcher("shared")
class SharedDispatcher(Dispatcher):
    pass


@register_dispatcher("round_robin")
class RoundRobinDispatcher(Dispatcher):
    """Deals items to consumers in turn; a starved consumer takes one item from the deepest queue."""

    def setup(self, ctx: ChannelContext) -> None:
        super().setup(ctx)
        if not ctx.consumers:
            raise ChannelError("round_robin dispatcher needs the consumers list at channel creation")
        self._next: dict[str, int] = {}

    def route(self, item: Any, key: str) -> str | None:
        turn = self._next.get(key, 0)
        self._next[key] = turn + 1
        return self.ctx.consumers[turn % len(self.ctx.consumers)]

    def rebalance(self, key: str, starved: str, depths: dict[str, int]) -> str | None:
        donor = max(depths, key=lambda c: depths[c], default=None)
        return donor if donor is not None and depths[donor] > 0 and donor != starved else None


def resolve_hook(spec: Any, kind: str, ctx: ChannelContext) -> Any:
    """A hook from a registered name, a 'module:Class' path, a class or an instance; setup() is called."""
    registry, base = (_COLLECTORS, Collector) if kind == "collector" else (_DISPATCHERS, Dispatcher)
    if spec is None:
        hook = base()
    elif isinstance(spec, str):
        if spec in registry:
            hook = registry[spec]()
        elif ":" in spec:
            module, _, attr = spec.partition(":")
            try:
                hook = getattr(importlib.import_module(module), attr)()
            except (ImportError, AttributeError) as exc:
                raise ChannelError(f"{kind} {spec!r} cannot be imported: {exc}") from exc
        else:
            raise ChannelError(f"unknown {kind} {spec!r}: registered are {sorted(registry)}; or give 'module:Class'")
    elif isinstance(spec, type):
        hook = spec()
    else:
        hook = spec
    if not isinstance(hook, base):
        raise ChannelError(f"{kind} {spec!r} is not a {base.__name__}")
    hook.setup(ctx)
    return hook
