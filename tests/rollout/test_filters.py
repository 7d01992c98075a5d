"""Group filters: zero variance and min_valid_attempts (what counts when an attempt id is missing)."""

import pytest

from rollout.filters import (
    MinValidAttemptsFilter,
    ZeroVarianceFilter,
    apply_filters,
    load_filter,
)
from rollout.types import GroupResult


def group(rewards, valid=None, ids=None):
    return GroupResult(rewards=rewards, valid=valid, attempt_ids=ids, group_id="g")


def test_zero_variance():
    f = ZeroVarianceFilter()
    assert f(group([1.0, 1.0, 1.0])) == (False, "zero_variance")
    assert f(group([0.5])) == (False, "zero_variance")  # one sample: no group-relative signal
    assert f(group([])).keep is False
    assert f(group([0.0, 1.0])).keep
    assert ZeroVarianceFilter(eps=0.2)(group([0.5, 0.6])) == (False, "zero_variance")
    with pytest.raises(ValueError):
        ZeroVarianceFilter(eps=-1)


def test_min_valid_attempts_counts_distinct_valid_ids():
    f = MinValidAttemptsFilter(2)
    assert f(group([0, 1, 1], valid=[True, True, True], ids=["a", "a", "a"])) == (False, "min_valid_attempts")
    assert f(group([0, 1, 1], valid=[True, False, True], ids=["a", "b", "c"])).keep
    assert f(group([0, 1], valid=[True, False], ids=["a", "b"])) == (False, "min_valid_attempts")


def test_min_valid_attempts_missing_id_counts_as_its_own_attempt():
    f = MinValidAttemptsFilter(2)
    assert f(group([0, 1], valid=[True, True], ids=[None, None])).keep  # two attempts, not one
    assert f(group([0, 1])).keep  # no ids at all, all valid
    assert f(group([0, 1], valid=[True, True], ids=["a", None])).keep
    assert not f(group([0, 1], valid=[True, False], ids=[None, None])).keep
    with pytest.raises(ValueError, match="differ in length"):
        f(group([0, 1], valid=[True]))


def test_load_filter_and_apply_order():
    assert isinstance(load_filter("zero_variance"), ZeroVarianceFilter)
    assert load_filter("min_valid_attempts", min_valid=3).min_valid == 3
    assert isinstance(load_filter("rollout.filters:ZeroVarianceFilter", eps=0.1), ZeroVarianceFilter)
    with pytest.raises(ValueError, match="unknown filter"):
        load_filter("nope")
    filters = [MinValidAttemptsFilter(3), ZeroVarianceFilter()]
    assert apply_filters(filters, group([1.0, 1.0])) == (False, "min_valid_attempts")
    assert apply_filters(filters, group([1.0, 1.0, 1.0])) == (False, "zero_variance")
    assert apply_filters(filters, group([0.0, 1.0, 1.0])).keep
