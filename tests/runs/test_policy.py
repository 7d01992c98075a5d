"""Settings: effective values from raw (defaults, fallbacks, clamping), validation messages, merging."""

from __future__ import annotations

import pytest

from runs.slots.policy import (
    PolicyError,
    policy_check_merged,
    policy_defaults,
    policy_effective,
    policy_merge,
    policy_validate,
)


def test_defaults_follow_max_total():
    p = policy_defaults(8)
    assert p.interactive_reserve == 2 and p.borrowable == 6
    assert {k: c.limit for k, c in p.classes.items()} == {"interactive": 8, "app": 6, "schedule": 6, "system": 6}
    assert {k: c.priority for k, c in p.classes.items()} == {"interactive": 40, "app": 30, "schedule": 20, "system": 10}


@pytest.mark.parametrize(
    "total,reserve,effective",
    [(1, None, 0), (2, None, 1), (3, None, 1), (4, None, 1), (12, None, 3), (4, 9, 3), (1, 5, 0), (5, 0, 0)],
)
def test_reserve_effective(total, reserve, effective):
    raw = {"max_total": total} | ({} if reserve is None else {"interactive_reserve": reserve})
    assert policy_effective(raw, default_max_total=4).interactive_reserve == effective


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "junk",
        {"max_total": True},
        {"max_total": 0},
        {"max_total": 5000},
        {"max_total": "4"},
        {"classes": "x"},
        {"classes": {"app": {"limit": 0}}},
        {"classes": {"app": {"priority": 101}}},
        {"classes": {"app": 3}},
    ],
)
def test_invalid_stored_values_fall_back_to_defaults(raw):
    p = policy_effective(raw, default_max_total=4)
    assert p == policy_defaults(4)


def test_stored_values_are_used_and_limits_follow_total():
    p = policy_effective({"max_total": 10, "classes": {"system": {"limit": 2, "priority": 50}}}, default_max_total=4)
    assert p.max_total == 10 and p.interactive_reserve == 2
    assert p.classes["system"].limit == 2 and p.classes["system"].priority == 50
    assert p.classes["app"].limit == 8 and p.classes["interactive"].limit == 10


@pytest.mark.parametrize(
    "changes,field,fragment",
    [
        ({"max_total": 0}, "max_total", "from 1 to 1000"),
        ({"max_total": 1001}, "max_total", "from 1 to 1000"),
        ({"max_total": True}, "max_total", "integer"),
        ({"max_total": "5"}, "max_total", "integer"),
        ({"max_total": 2.5}, "max_total", "integer"),
        ({"interactive_reserve": -1}, "interactive_reserve", "from 0 to 1000"),
        ({"interactive_reserve": 1001}, "interactive_reserve", "from 0 to 1000"),
        ({"interactive_reserve": False}, "interactive_reserve", "integer"),
        ({"classes": {"gpu": {"limit": 1}}}, "classes.gpu", "unknown class"),
        ({"classes": []}, "classes", "object"),
        ({"classes": {"app": 3}}, "classes.app", "object"),
        ({"classes": {"app": {"limit": 0}}}, "classes.app.limit", "from 1 to 1000"),
        ({"classes": {"app": {"limit": 1001}}}, "classes.app.limit", "from 1 to 1000"),
        ({"classes": {"app": {"limit": True}}}, "classes.app.limit", "integer"),
        ({"classes": {"system": {"priority": 101}}}, "classes.system.priority", "from 0 to 100"),
        ({"classes": {"system": {"priority": -1}}}, "classes.system.priority", "from 0 to 100"),
        ({"classes": {"system": {"priority": "high"}}}, "classes.system.priority", "integer"),
        ({"classes": {"system": {"weight": 1}}}, "classes.system.weight", "unknown field"),
        ({"classes": {"app": {"gpu_limit": -1}}}, "classes.app.gpu_limit", "from 0 to 1000"),
        ({"classes": {"app": {"gpu_limit": 1001}}}, "classes.app.gpu_limit", "from 0 to 1000"),
        ({"classes": {"app": {"gpu_limit": 1.5}}}, "classes.app.gpu_limit", "integer"),
        ({"classes": {"app": {"gpu_limit": True}}}, "classes.app.gpu_limit", "integer"),
        ({"max_slots": 3}, "max_slots", "unknown setting"),
        ([1, 2], "settings", "object"),
    ],
)
def test_validation_messages_name_the_field(changes, field, fragment):
    with pytest.raises(PolicyError) as info:
        policy_validate(changes)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ") and fragment in str(info.value)


@pytest.mark.parametrize(
    "stored,changes,ok",
    [
        ({}, {"max_total": 4, "interactive_reserve": 4}, False),
        ({}, {"max_total": 4, "interactive_reserve": 3}, True),
        ({"max_total": 3}, {"interactive_reserve": 3}, False),
        ({}, {"max_total": 1, "interactive_reserve": 1}, True),  # max_total 1: reserve clamps to 0
        ({}, {"interactive_reserve": 4}, False),  # default max_total is 4
    ],
)
def test_reserve_must_stay_below_max_total(stored, changes, ok):
    policy_validate(changes)
    raw = policy_merge(stored, changes, partial=True)
    if ok:
        policy_check_merged(raw, default_max_total=4, changes=changes)
    else:
        with pytest.raises(PolicyError, match=r"^interactive_reserve: must be below max_total"):
            policy_check_merged(raw, default_max_total=4, changes=changes)


def test_partial_merges_and_full_replaces():
    stored = {"max_total": 10, "classes": {"app": {"limit": 2}}}
    merged = policy_merge(stored, {"classes": {"app": {"priority": 5}, "system": {"limit": 1}}}, partial=True)
    assert merged == {"max_total": 10, "classes": {"app": {"limit": 2, "priority": 5}, "system": {"limit": 1}}}
    replaced = policy_merge(stored, {"interactive_reserve": 2}, partial=False)
    assert replaced == {"interactive_reserve": 2, "classes": {}}
    reset = policy_merge({"max_total": 10, "interactive_reserve": 3}, {"interactive_reserve": None}, partial=True)
    assert reset == {"max_total": 10, "classes": {}}


def test_gpu_limit_is_optional_and_null_removes_it():
    assert policy_effective({}, default_max_total=4).classes["app"].gpu_limit is None
    policy_validate({"classes": {"app": {"gpu_limit": None}}})  # null: no limit
    stored = policy_merge({}, {"classes": {"app": {"gpu_limit": 2}}}, partial=True)
    assert policy_effective(stored, default_max_total=4).classes["app"].gpu_limit == 2
    cleared = policy_merge(stored, {"classes": {"app": {"gpu_limit": None}}}, partial=True)
    assert (
        cleared["classes"]["app"] == {}
        and policy_effective(cleared, default_max_total=4).classes["app"].gpu_limit is None
    )
    assert (
        policy_effective({"classes": {"app": {"gpu_limit": "x"}}}, default_max_total=4).classes["app"].gpu_limit is None
    )
