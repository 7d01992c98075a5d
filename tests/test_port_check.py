"""`make run`'s free-port check (platform/embedded.py): a port whose last server stopped a moment ago, with its
connections in TIME_WAIT, is free (the server binds it with SO_REUSEADDR); a port something listens on is not."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "platform"))

from embedded import port_is_free  # noqa: E402


def _time_wait_on(port_holder: socket.socket, connections: int) -> None:
    """Accept `connections` and close each from the server side first: the server's end goes to TIME_WAIT."""
    port = port_holder.getsockname()[1]
    for _ in range(connections):
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = port_holder.accept()
        conn.close()  # the active close: TIME_WAIT stays on the server's port
        client.recv(1)
        client.close()


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    assert not port_is_free(port)  # listening
    _time_wait_on(server, 5)
    server.close()
    states = Path("/proc/net/tcp").read_text().splitlines()[1:]
    local = f":{port:04X}"
    assert any(line.split()[1].endswith(local) and line.split()[3] == "06" for line in states), "no TIME_WAIT"
    assert port_is_free(port)
    # A plain bind (what the check did before) is refused in exactly this state.
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
            refused = False
        except OSError:
            refused = True
    assert refused
