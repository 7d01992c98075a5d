"""The REST surface: one typed method per operation (docs/api.md). Every call raises ApiError on a refusal
(with the API's field and message) and ConnectionFailed when the platform cannot be reached; POSTs that change
something carry an Idempotency-Key, so the client retries them on a lost connection without acting twice."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import httpx

from client.errors import ApiError, ConnectionFailed
from client.follow import TERMINAL, follow_events
from client.types import Event, Run

RETRIES = 3  # attempts of one request on a connection error (each POST keeps its Idempotency-Key)
CONFIG_FILE = Path("~/.config/rlcp/client.json")


def settings_from(url: str | None, token: str | None) -> tuple[str, str]:
    """The platform's URL and token: the arguments, else RLCP_URL / RLCP_TOKEN, else the config file
    (RLCP_CONFIG or ~/.config/rlcp/client.json: {"url": ..., "token": ...})."""
    path = Path(os.environ.get("RLCP_CONFIG", str(CONFIG_FILE))).expanduser()
    stored = json.loads(path.read_text()) if path.is_file() else {}
    url = url or os.environ.get("RLCP_URL") or stored.get("url") or "http://127.0.0.1:8000"
    token = token or os.environ.get("RLCP_TOKEN") or stored.get("token")
    if not token:
        raise ValueError("no API token: pass token=, set RLCP_TOKEN, or put it in the config file")
    return url.rstrip("/"), token


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url, self._token = settings_from(url, token)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers={"Authorization": f"Token {self._token}"})

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- runs ------------------------------------------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        config: dict[str, Any] | None = None,
        kind: str = "rl_train",
        time_limit_seconds: int | None = None,
        auto_resume: bool = False,
        idempotency_key: str | None = None,
        wait: bool = False,
        follow: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> Run:
        """Submit a run (201), or get the one an earlier try with the same `idempotency_key` made (one is made
        up when not given: retries of this call are safe). `wait`: return once the run has ended (its final
        JSON). `follow`: the same, passing each of its events to `on_event` as it comes."""
        body: dict[str, Any] = {"name": name, "kind": kind, "config": config or {}, "auto_resume": auto_resume}
        if time_limit_seconds is not None:
            body["time_limit_seconds"] = time_limit_seconds
        run = cast(Run, self._call("POST", "/api/runs/", json=body, key=idempotency_key or uuid.uuid4().hex))
        if wait or follow:
            return self.wait(run["id"], on_event=on_event if follow else None)
        return run

    def get(self, run_id: int) -> Run:
        return cast(Run, self._call("GET", f"/api/runs/{int(run_id)}/"))

    def list(self, *, status: str | None = None, run_class: str | None = None) -> Iterator[Run]:
        """Every run the user may see (own, or all for staff), newest first, page by page."""
        params = {k: v for k, v in {"status": status, "run_class": run_class}.items() if v}
        page = 1
        while True:
            answer = self._call("GET", "/api/runs/", params={**params, "page": page})
            yield from answer["results"]
            if not answer.get("next"):
                return
            page += 1

    def cancel(self, run_id: int, *, idempotency_key: str | None = None) -> Run:
        key = idempotency_key or uuid.uuid4().hex
        return cast(Run, self._call("POST", f"/api/runs/{int(run_id)}/cancel/", key=key))

    def resume(self, run_id: int, *, from_scratch: bool = False, idempotency_key: str | None = None) -> Run:
        key = idempotency_key or uuid.uuid4().hex
        body = {"from_scratch": from_scratch}
        return cast(Run, self._call("POST", f"/api/runs/{int(run_id)}/resume/", json=body, key=key))

    def events(self, run_id: int, *, after: int = 0) -> Iterator[Event]:
        """The run's stored events with seq > `after`, in order, page by page (the REST history)."""
        while True:
            page: list[Event] = self._call("GET", f"/api/runs/{int(run_id)}/events/", params={"after": after})
            yield from page
            if len(page) == 0 or "next" not in self._last_links:
                return
            after = page[-1]["seq"]

    def follow(self, run_id: int, *, after: int | None = 0, stop_at_end: bool = True) -> Iterator[Event]:
        """The run's events from seq `after` + 1 on (None: only those after the moment of connecting), each
        exactly once and in order, across reconnects (a dropped socket reconnects with a new ticket and
        ?after=<last seq>). Ends after a terminal `status` event, or at once for a run already ended, when
        `stop_at_end`."""
        return follow_events(self, int(run_id), after=after, stop_at_end=stop_at_end)

    def priority(self, run_id: int) -> dict[str, Any]:
        """Why a queued run is where it is: `{position, factors}` (class priority, waited, aging, max wait, fair
        share, per-user limit); both null unless it is queued."""
        return cast(dict[str, Any], self._call("GET", f"/api/runs/{int(run_id)}/priority/"))

    def wait(self, run_id: int, *, on_event: Callable[[Event], None] | None = None) -> Run:
        """Block until the run has ended; its final JSON."""
        run = self.get(run_id)
        if run["status"] not in TERMINAL:
            for event in self.follow(run_id, after=0 if on_event else None):
                if on_event is not None:
                    on_event(event)
        return self.get(run_id)

    # --- queue and settings ----------------------------------------------------------------------------------

    def slots(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call("GET", "/api/slots/"))

    def dry_run(
        self, *, origin: str = "api", kind: str | None = None, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"origin": origin}
        if kind is not None or config is not None:
            body |= {"kind": kind or "rl_train", "config": config or {}}
        return cast(dict[str, Any], self._call("POST", "/api/slots/dry-run/", json=body))

    def settings(self) -> dict[str, Any]:
        """The concurrency settings (staff only: 403 otherwise)."""
        return cast(dict[str, Any], self._call("GET", "/api/settings/concurrency/"))

    def ws_ticket(self) -> str:
        return str(self._call("POST", "/api/ws-ticket/")["ticket"])

    # --- transport -------------------------------------------------------------------------------------------

    _last_links: dict[str | None, Any] = {}

    def _call(self, method: str, path: str, *, key: str | None = None, **kwargs: Any) -> Any:
        headers = {"Idempotency-Key": key} if key else {}
        for attempt in range(RETRIES):
            try:
                answer = self._http.request(method, path, headers=headers, **kwargs)
                break
            except httpx.TransportError as exc:
                if method != "GET" and key is None or attempt == RETRIES - 1:
                    raise ConnectionFailed(f"{method} {self.url}{path}: {exc}") from exc
                time.sleep(0.5 * 2**attempt)
        self._last_links = dict(answer.links)
        if answer.status_code >= 400:
            try:
                body = answer.json()
            except ValueError:
                body = answer.text[:500]
            raise ApiError(answer.status_code, body)
        return answer.json()
