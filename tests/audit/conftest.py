from tests.runs.helpers import (  # noqa: F401
    _fast_password_hashing,
    _fresh_policy_cache,
    handoffs,
    other_user,
    register_test_kind,
    staff,
    user,
)

register_test_kind()
