"""Channel: keyed, weighted FIFO between rollout producers and trainer consumers (local or named Ray actor)."""

from rollout.channel.channel import Channel
from rollout.channel.hooks import (
    ChannelContext,
    Collector,
    Dispatcher,
    register_collector,
    register_dispatcher,
)
from rollout.channel.state import DEFAULT_KEY

__all__ = [
    "Channel",
    "ChannelContext",
    "Collector",
    "Dispatcher",
    "register_collector",
    "register_dispatcher",
    "DEFAULT_KEY",
]
