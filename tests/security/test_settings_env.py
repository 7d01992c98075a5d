"""The environment readers of config/env.py, and the secret-key criteria start-up applies with DEBUG off."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    INSECURE_DEFAULT_SECRET_KEY,
    env_bool,
    env_int,
    env_list,
    refuse_insecure_secret_key,
    secret_key_problem,
)


def test_readers_fall_back_to_the_default_and_parse_what_is_set(monkeypatch):
    monkeypatch.delenv("RLCP_TEST_VAR", raising=False)
    assert env_bool("RLCP_TEST_VAR", True) is True
    assert env_int("RLCP_TEST_VAR", 7) == 7
    assert env_list("RLCP_TEST_VAR", "a,,b") == ["a", "b"]
    for text, expected in [(" Yes ", True), ("on", True), ("1", True), ("0", False), ("", False), ("nope", False)]:
        monkeypatch.setenv("RLCP_TEST_VAR", text)
        assert env_bool("RLCP_TEST_VAR", not expected) is expected
    monkeypatch.setenv("RLCP_TEST_VAR", "")
    assert env_int("RLCP_TEST_VAR", 7) == 7  # set but empty: the default
    assert env_list("RLCP_TEST_VAR", "a") == []  # set but empty: no items
    monkeypatch.setenv("RLCP_TEST_VAR", "42")
    assert env_int("RLCP_TEST_VAR", 7) == 42


@pytest.mark.parametrize("key", ["", INSECURE_DEFAULT_SECRET_KEY, "django-insecure-" + "x" * 60, "ab" * 40, "k" * 49])
def test_unfit_keys_are_named_and_refused_only_with_debug_off(key):
    assert secret_key_problem(key)
    refuse_insecure_secret_key(key, debug=True)
    with pytest.raises(ImproperlyConfigured, match="DJANGO_SECRET_KEY is insecure"):
        refuse_insecure_secret_key(key, debug=False)


def test_a_long_random_key_passes():
    key = "q8Zr-4Lx_0pVt2WmNc7YbHs9KdJf3GaEiRuT6oPl1nMkXvBwQyCzAe5Sg"
    assert len(key) >= 50 and secret_key_problem(key) is None
    refuse_insecure_secret_key(key, debug=False)


def test_every_setting_of_the_split_modules_reaches_django_settings():
    """config/settings.py imports config/knobs.py and config/security.py by name: a setting added to either and
    not imported there would silently not exist as django.conf.settings.<NAME>."""
    from django.conf import settings

    import config.knobs
    import config.security

    for module in (config.knobs, config.security):
        names = [n for n in vars(module) if n.isupper()]
        assert names
        missing = [n for n in names if not hasattr(settings, n)]
        assert not missing, f"{module.__name__}: not imported by config/settings.py: {missing}"
        assert all(getattr(settings, n) == getattr(module, n) for n in names)
