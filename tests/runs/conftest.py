from tests.runs.helpers import _fresh_policy_cache, handoffs, other_user, register_test_kind, staff, user  # noqa: F401

register_test_kind()
