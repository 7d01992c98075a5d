"""The proxy's rules as pure functions (runs/api/proxy_rules.py, runs/execution/serving.py): which paths and methods are
forwarded, how session ids are namespaced, which bodies and serving URLs are refused."""

from __future__ import annotations

import pytest

from runs.api.proxy_rules import ProxyRefused, body_check, external_session, route, session_id_choose
from runs.execution.serving import serving_host, serving_url_allowed

NODES = {"10.0.0.5", "fd00::5"}
CHAT = [{"role": "user", "content": "hi"}]


def test_only_the_four_routes_are_forwarded_with_their_methods():
    assert route("chat/completions", "POST", 7).upstream_path == "chat/completions"
    assert route("completions", "POST", 7).has_body
    assert not route("models", "GET", 7).has_body
    trajectory = route("sessions/abc/trajectory", "GET", 7)
    assert trajectory.upstream_path == "sessions/ext-7-abc/trajectory" and trajectory.session_in_path == "abc"
    for path in ("engines", "sessions/abc", "sessions/a/b/trajectory", "models/x", "", "chat/completions/"):
        with pytest.raises(ProxyRefused) as refused:
            route(path, "GET", 7)
        assert refused.value.status == 404, path
    with pytest.raises(ProxyRefused) as refused:
        route("models", "POST", 7)
    assert refused.value.status == 405
    with pytest.raises(ProxyRefused) as refused:
        route("sessions/..%2F/trajectory", "GET", 7)
    assert refused.value.status == 400 and refused.value.field == "session_id"


def test_session_ids_come_from_the_body_then_the_header_else_fresh_and_are_namespaced():
    assert session_id_choose({"session_id": "b"}, "h") == ("b", False)
    assert session_id_choose({}, "h") == ("h", False)
    fresh, is_fresh = session_id_choose(None, None)
    assert is_fresh and len(fresh) == 32
    assert external_session(3, "s") == "ext-3-s"
    for bad in ("", "a/b", "x" * 129, 5, "a b"):
        with pytest.raises(ProxyRefused):
            session_id_choose({"session_id": bad}, None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": CHAT, "n": 0}, "n"),
        ({"messages": CHAT, "n": True}, "n"),
        ({"messages": CHAT, "max_tokens": 10**9}, "max_tokens"),
        ({"messages": CHAT, "temperature": "hot"}, "temperature"),
        ({"messages": CHAT, "model": 3}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "root", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages[0].content[0]"),
        ("x", "body"),
    ],
)
def test_hostile_chat_bodies_are_refused_naming_the_field(body, field):
    with pytest.raises(ProxyRefused) as refused:
        body_check("chat/completions", body)
    assert refused.value.status == 400 and refused.value.field == field


def test_good_bodies_pass_unchanged():
    chat = {"messages": [*CHAT, {"role": "assistant", "content": None}], "n": 2, "max_tokens": 16, "stream": True}
    assert body_check("chat/completions", chat) is chat
    assert body_check("completions", {"prompt": ["a", "b"]})
    with pytest.raises(ProxyRefused):
        body_check("completions", {"prompt": [1]})


def test_a_serving_url_must_name_a_node_or_loopback_on_an_unprivileged_port():
    assert serving_host("http://10.0.0.5:8000") == "10.0.0.5"
    assert serving_url_allowed("http://10.0.0.5:8000", NODES)
    assert serving_url_allowed("http://127.0.0.1:8000/", NODES)
    assert serving_url_allowed("http://[::1]:8000", NODES)
    assert serving_url_allowed("http://[fd00::5]:8000", NODES)
    for url in (
        "http://10.0.0.6:8000",  # not a node
        "http://169.254.169.254:8000",  # cloud metadata
        "http://10.0.0.5:22",  # privileged port
        "http://10.0.0.5",  # no port
        "https://10.0.0.5:8000",
        "http://node.local:8000",
        "http://u:p@10.0.0.5:8000",
        "http://10.0.0.5:8000/admin",
        "http://10.0.0.5:8000?x=1",
        "http://0.0.0.0:8000",
    ):
        assert not serving_url_allowed(url, NODES), url
