"""Core sets per emulated machine: parsing, splitting, pinning."""

from __future__ import annotations

import os

import pytest

from tandem.errors import TandemError
from tandem.testbed import cpus


def test_parse_cpus():
    assert cpus.parse_cpus("0") == [0]
    assert cpus.parse_cpus("3,0-1") == [0, 1, 3]
    for bad in ("", "a", "1-x"):
        with pytest.raises(TandemError, match="bad cpu list"):
            cpus.parse_cpus(bad)


def test_plan_splits_cores_in_order_and_shares_when_short():
    assert cpus.plan(cores=[0, 1]) == {"device": [0], "cloud": [1]}
    assert cpus.plan(cores=[4, 5, 6, 7]) == {"device": [4, 5], "cloud": [6, 7]}
    assert cpus.plan(cores=[0]) == {"device": [0], "cloud": [0]}


def test_pin_role_sets_affinity_and_threads_and_rejects_unknown_roles():
    import torch

    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        got = cpus.pin_role("cloud")
        assert set(got) == os.sched_getaffinity(0)
        assert torch.get_num_threads() == len(got)
        state = cpus.machine_state()
        assert state["cpus"] == got and len(state["loadavg"]) == 3
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    with pytest.raises(TandemError, match="unknown role"):
        cpus.pin_role("edge")
