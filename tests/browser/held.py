"""The Chromium and the daphne that the browser tests hold across modules (tests/held.py). They live here, not in
tests/browser/conftest.py: pytest imports that file as `conftest` and a test module elsewhere that imports its
fixtures (tests/security/test_browser_xss.py) gets a second copy of it, with holders of its own."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import sync_playwright

from tests.browser.stack import CHROMIUM, CHROMIUM_ARGS, Server
from tests.held import Held


class Chromium:
    """Headless Chromium under Playwright's sync API. That API keeps an event loop running in this thread, which
    makes Django refuse ORM calls as "async context"; they are plain sync calls here, so they are allowed exactly
    while Playwright runs (the loop is gone before any test that does not use the browser runs: tests/held.py)."""

    def __init__(self) -> None:
        if not os.path.exists(CHROMIUM):
            pytest.fail(
                f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` (.ci/run does)", pytrace=False
            )
        self.previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
        self.playwright = sync_playwright()
        try:
            self.browser = self.playwright.__enter__().chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if hasattr(self, "browser"):
                self.browser.close()
        finally:
            self.playwright.__exit__(None, None, None)
            if self.previous is None:
                os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
            else:
                os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = self.previous


# One Chromium and one daphne for all the browser tests that run in a row (starting them took seconds per module).
CHROMIUM_HELD: Held[Chromium] = Held("browser", Chromium.close)
DAPHNE_HELD: Held[Server] = Held("daphne_held", Server.stop)
