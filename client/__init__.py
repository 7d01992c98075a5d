"""A Python client and CLI for the RL control plane's REST API and run streams (no Django: httpx and websockets).

    from client import Client
    cp = Client("http://127.0.0.1:8000", token="...")      # or RLCP_URL / RLCP_TOKEN from the environment
    run = cp.submit(name="digits", config={"steps": 20})   # retried safely: an Idempotency-Key is sent
    for event in cp.follow(run["id"]): ...                 # every event once, in order, across reconnects
    cp.get(run["id"])["status"]

CLI: `python -m client --help` (docs/client.md)."""

from client.api import Client
from client.errors import ApiError, ConnectionFailed
from client.follow import TERMINAL

__all__ = ["ApiError", "Client", "ConnectionFailed", "TERMINAL"]
