"""Agents: environments and tools that drive a run's policy over HTTP (Django-free)."""
