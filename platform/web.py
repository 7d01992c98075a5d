"""The web process: daphne serving config.asgi:application, with the flags the environment calls for.

`--proxy-headers` (daphne then takes the client address from X-Forwarded-For) only when a trusted proxy count is
set (DJANGO_NUM_PROXIES > 0, the same variable the sign-in limits read): without a proxy in front, that header
comes from the client itself, and trusting it would let anyone pick the address their sign-in failures are
counted against. The Procfile runs `python platform/web.py` (WEB_BIND, default 0.0.0.0; PORT, default 8000);
platform/up.py builds the embedded web process's argv with `daphne_argv`.
This is a script, not a package: a package named `platform` would shadow the standard library module.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping


def trusted_proxies(env: Mapping[str, str]) -> int:
    """DJANGO_NUM_PROXIES as a count (unset or empty: 0); anything but a non-negative integer is an error."""
    raw = env.get("DJANGO_NUM_PROXIES", "").strip() or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise SystemExit(f"DJANGO_NUM_PROXIES={raw!r}: expected the number of trusted proxies (0 or more)")
    return int(raw)


def daphne_argv(
    env: Mapping[str, str], *, daphne: str, bind: str, port: str, access_log: str | None = None
) -> list[str]:
    argv = [daphne, "-b", bind, "-p", port]
    if access_log:
        argv += ["--access-log", access_log]
    if trusted_proxies(env) > 0:
        argv.append("--proxy-headers")
    return [*argv, "config.asgi:application"]


def main() -> None:
    daphne = shutil.which("daphne", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if daphne is None:
        raise SystemExit("daphne is not installed (pip install -r requirements.txt)")
    bind, port = os.environ.get("WEB_BIND", "0.0.0.0"), os.environ.get("PORT", "8000")
    argv = daphne_argv(os.environ, daphne=daphne, bind=bind, port=port)
    os.execv(daphne, argv)


if __name__ == "__main__":
    main()
