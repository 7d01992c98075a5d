"""Content-Security-Policy on every HTML page, and no inline script or inline event handler in what the
server renders, even for runs whose name and config are hostile (issue 9, point 4)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db

PAYLOADS = [
    '"><img src=x onerror=alert(1)>',
    "<script>alert(1)</script>",
    "<svg onload=alert(1)>",
    "javascript:alert(1)",
    "' onmouseover='alert(1)",
]
REQUIRED = {
    "default-src": "'self'",
    "script-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
    "connect-src": "'self'",
}


def policy(response) -> dict[str, str]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{response.request['PATH_INFO']}: no Content-Security-Policy header"
    return {part.split()[0]: " ".join(part.split()[1:]) for part in header.split(";") if part.strip()}


def assert_no_inline_code(html: str, where: str) -> None:
    for tag in re.findall(r"<script\b[^>]*>", html, flags=re.I):
        assert "src=" in tag or 'type="application/json"' in tag, f"{where}: inline script {tag}"
    # An on* attribute in markup would be an inline handler (blocked by the policy, but none should exist).
    assert not re.search(r"<[a-z][^>]*\son[a-z]+\s*=", html, flags=re.I), f"{where}: inline event handler"
    assert "<img src=x" not in html and "<svg onload" not in html, f"{where}: a payload rendered as markup"


@pytest.fixture
def hostile_run(django_user_model) -> Run:
    owner = django_user_model.objects.create_user("mallory", password="pw")
    return Run.objects.create(
        name=PAYLOADS[0] + PAYLOADS[1],
        origin="api",
        run_class="app",
        kind="rl_train",
        owner=owner,
        status=RunStatus.FAILED,
        error=PAYLOADS[2],
        config={"task": PAYLOADS[3], "note": PAYLOADS[4], PAYLOADS[2]: 1},
    )


def test_every_html_page_carries_the_policy(django_user_model, hostile_run: Run) -> None:
    staff = django_user_model.objects.create_user("boss", password="pw", is_staff=True, is_superuser=True)
    anonymous, client = Client(), Client()
    client.force_login(staff)
    pages = {
        "login": (anonymous, "/login/", 200),
        "board": (client, "/", 200),
        "run page": (client, f"/runs/{hostile_run.pk}/", 200),
        "submit": (client, "/runs/new/", 200),
        "compare": (client, f"/compare/?runs={hostile_run.pk}", 200),
        "compare bad input": (client, "/compare/?runs=" + PAYLOADS[0].replace(" ", "%20"), 400),
        "settings": (client, "/settings/", 200),
        "admin": (client, "/admin/", 200),
        "admin run": (client, f"/admin/runs/run/{hostile_run.pk}/change/", 200),
        "admin login": (anonymous, "/admin/login/", 200),
        "404": (client, "/no-such-page/", 404),
    }
    for name, (who, path, status) in pages.items():
        response = who.get(path)
        assert response.status_code == status, (name, response.status_code)
        assert response["Content-Type"].startswith("text/html"), name
        directives = policy(response)
        for directive, value in REQUIRED.items():
            assert directives.get(directive) == value, (name, directive, directives.get(directive))
        # No inline script anywhere: neither 'unsafe-inline' nor 'unsafe-eval' for scripts.
        assert "unsafe" not in directives["script-src"], name
        assert "unsafe-inline" not in directives.get("style-src-elem", ""), name
        assert_no_inline_code(response.content.decode(), name)


def test_run_page_escapes_hostile_name_config_and_error(django_user_model, hostile_run: Run) -> None:
    client = Client()
    client.force_login(hostile_run.owner)
    html = client.get(f"/runs/{hostile_run.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the title and heading show the name as text
    assert "<script>alert(1)</script>" not in html
    assert "javascript:alert(1)" not in re.findall(r'href="([^"]*)"', html)
    assert_no_inline_code(html, "run page")
