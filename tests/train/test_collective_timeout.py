"""The built-in trainer's process-group timeout comes from the run contract (set on GKE)."""

from __future__ import annotations

import datetime

import pytest

from sailor_tasks.train.__main__ import COLLECTIVE_TIMEOUT_ENV, collective_timeout


def test_the_timeout_is_read_from_the_environment_or_left_to_torch():
    assert collective_timeout({COLLECTIVE_TIMEOUT_ENV: "300"}) == datetime.timedelta(seconds=300)
    assert collective_timeout({}) is None and collective_timeout({COLLECTIVE_TIMEOUT_ENV: ""}) is None


@pytest.mark.parametrize("raw", ["0", "-5", "5m", "nan"])
def test_a_bad_timeout_is_named(raw):
    with pytest.raises(ValueError, match=f"SAILOR_COLLECTIVE_TIMEOUT_S='{raw}' is not a positive number"):
        collective_timeout({COLLECTIVE_TIMEOUT_ENV: raw})


def test_gke_pods_set_it():
    from sailor_tasks.backends import gke

    assert gke.COLLECTIVE_TIMEOUT_S > 0 and COLLECTIVE_TIMEOUT_ENV == "SAILOR_COLLECTIVE_TIMEOUT_S"
