"""Agents over HTTP: the chat vocabulary and template (`agents.chat`), the per-run OpenAI-compatible session
server (`agents.server`), its request models (`agents.protocol`) and token-exact trajectories
(`agents.trajectory`). Django-free; imports `rollout`, never `trainer` (it talks to engines through handles)."""
