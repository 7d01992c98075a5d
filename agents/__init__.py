"""Agents over HTTP (Django-free; imports `rollout`, never `trainer`: it talks to engines through handles):
the chat vocabulary and template (`agents.chat`), the per-run OpenAI-compatible session server
(`agents.server`, request models in `agents.protocol`, token-exact records in `agents.trajectory`), the
environments that drive it with the OpenAI client (`agents.environments`, `agents.envs`) and the sandbox their
code tool runs in (`agents.sandbox`)."""
