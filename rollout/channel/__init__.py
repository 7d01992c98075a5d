"""Channel: keyed, weighted FIFO between rollout producers and trainer consumers (local or named Ray actor)."""

from rollout.channel.channel import Channel
from rollout.channel.hooks import ChannelContext, Collector, register_collector
from rollout.channel.state import DEFAULT_KEY

__all__ = [
    "Channel",
    "ChannelContext",
    "Collector",
    "register_collector",
    "DEFAULT_KEY",
]
