"""Browser-test fixtures: a real daphne server on the test database (PostgreSQL) and Redis, one headless
Chromium, both held across the browser tests in a row (tests/held.py), users, and helpers that drive runs
through the real services and ingest endpoint."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.browser.held import CHROMIUM_HELD, DAPHNE_HELD, Chromium
from tests.browser.stack import ARTIFACTS, Emitter, Server, free_port, server_start
from tests.held import Held
from tests.processes import committed_database_url

PASSWORD = "pw-browser"
expect.set_options(timeout=10_000)


@pytest.fixture(scope="module")
def browser() -> Browser:
    """The held Chromium (tests/held.py): kept while the next test uses a browser too, closed before one that
    does not."""
    return CHROMIUM_HELD.get(Chromium).browser


@pytest.fixture(scope="session")
def daphne_held(django_db_setup) -> Iterator[Held[Server]]:
    """The held daphne, stopped at the latest before the test database is dropped (it is connected to it)."""
    yield DAPHNE_HELD
    DAPHNE_HELD.release()


@pytest.fixture(scope="module")
def server(daphne_held: Held[Server], django_db_blocker, redis_url: str) -> Server:
    """daphne on the test database, held across the browser tests in a row (each test's data is committed by
    transactional_db and flushed after it). Celery runs eagerly inside the server and Ray is unreachable, so a
    granted run stays `starting` (the launcher leaves it for the tick) until the test drives it like a job
    would."""

    def start() -> Server:
        with django_db_blocker.unblock():
            database_url = committed_database_url("browser tests")
        return server_start(
            database_url=database_url,
            redis_url=redis_url,
            extra_env={
                "CELERY_TASK_ALWAYS_EAGER": "1",
                "RAY_ADDRESS": f"http://127.0.0.1:{free_port()}",
                "SLOTS_POLICY_CACHE_SECONDS": "0",
                "SLOTS_HEARTBEAT_TIMEOUT_SECONDS": "600",
            },
        )

    return daphne_held.get(start)


@pytest.fixture(autouse=True)
def same_layer_as_server(request: pytest.FixtureRequest, settings) -> Iterator[None]:
    """This process publishes too (services called by the test): same channel-layer prefix as the server,
    and no policy cache (the server changes settings the test then reads)."""
    from channels.layers import channel_layers

    if "server" not in request.fixturenames:
        yield
        return
    srv: Server = request.getfixturevalue("server")
    layers = {k: dict(v) for k, v in settings.CHANNEL_LAYERS.items()}
    layers["default"]["CONFIG"] = {**layers["default"]["CONFIG"], "prefix": srv.prefix}
    settings.CHANNEL_LAYERS = layers
    settings.SLOTS_POLICY_CACHE_SECONDS = 0
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def no_celery_from_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Services called from the test process hand granted runs to Celery; there is no worker for them here
    (the server runs its own eagerly), so record nothing and leave the run `starting`, as a slow worker would."""
    from runs import tasks

    monkeypatch.setattr(tasks.dispatch_run, "delay", lambda run_id: None)
    monkeypatch.setattr(tasks.stop_run, "delay", lambda *args: None)


@pytest.fixture
def users(django_user_model) -> dict[str, Any]:
    return {
        "alice": django_user_model.objects.create_user("alice", password=PASSWORD),
        "boss": django_user_model.objects.create_user("boss", password=PASSWORD, is_staff=True),
    }


@pytest.fixture
def context(browser: Browser, request: pytest.FixtureRequest) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    errors: list[str] = []
    ctx.on("weberror", lambda err: errors.append(str(err.error)))
    yield ctx
    ctx.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def login(page: Page, server: Server, username: str) -> None:
    """Log in through the real login form."""
    page.goto(f"{server.url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/login/" not in url)


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")  # a sticky top bar would otherwise be painted mid-page
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn` in a worker thread. Playwright's event loop runs in the test thread, where Channels'
    async_to_sync (used by the services to publish after commit) refuses to run."""
    from django.db import connection as thread_connection

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            thread_connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


class OffLoopServices:
    """The write operations the browser tests call (submit, moves, settings), each made through in_thread."""

    WHERE = {
        "run_submit": "runs.execution.submit",
        "run_cancel": "runs.core.cancel",
        "run_finish": "runs.core.lifecycle",
        "run_transition": "runs.core.lifecycle",
        "settings_update": "runs.scheduling.concurrency",
    }

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(import_module(self.WHERE[name]), name)
        return lambda *args, **kwargs: in_thread(fn, *args, **kwargs)


svc = OffLoopServices()


def emitter_for(server: Server, run: Any) -> Emitter:
    return Emitter(base_url=server.url, run_id=run.pk, token=run.ingest_token)


@pytest.fixture
def shoot() -> Callable[[Page, str], None]:
    return shot
