"""The shipped environments: `digits` (today's task over HTTP), `tools` (a tool-calling agent), `code` (a
sandboxed code tool). Registered by name in agents/environments.py."""
