"""In-process pairs: a PinnedModel's calls really run on its side's cores."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from tandem.testbed import cpus
from tandem.testbed.pinned import PinnedModel, pinned


class Probe:
    """A stand-in model that reports where each call ran."""

    name = "probe"

    def __init__(self) -> None:
        self.calls = 0

    def where(self) -> tuple[set[int], int, int]:
        self.calls += 1
        return os.sched_getaffinity(0), torch.get_num_threads(), threading.get_native_id()

    def fail(self) -> None:
        raise ValueError("from the engine")


@pytest.fixture
def second_core() -> int:
    cores = cpus.available()
    if len(cores) < 2:
        pytest.skip("needs two cores")
    return cores[1]


def test_calls_run_on_pinned_workers_attributes_read_through(second_core):
    probe = Probe()
    side = PinnedModel(probe, [second_core], role="cloud")
    try:
        affinity, threads, worker = side.where()
        assert affinity == {second_core} and threads == 1
        assert worker != threading.get_native_id()
        assert os.sched_getaffinity(0) != {second_core}  # the caller is left as it was
        assert side.name == "probe" and side.calls == 1 and side.cores == [second_core]
        side.name = "renamed"  # attributes are the model's own
        assert probe.name == "renamed"
        with pytest.raises(ValueError, match="from the engine"):
            side.fail()
        assert side.run(lambda lm: lm is probe)
        assert side.observed()["cpus"] == [second_core]
    finally:
        side.close()


def test_pinned_pair_matches_the_bare_model_and_records_each_side(tiny_lm):
    sets = cpus.plan()
    observed: dict = {}
    ids = tiny_lm.tokenizer.encode("def add(a, b):")
    bare = tiny_lm.prefill(ids)
    with pinned({"device": tiny_lm, "cloud": tiny_lm}, sets, observed) as sides:
        state = sides["device"].prefill(ids)
        assert torch.equal(state.logits, bare.logits)
        logits = sides["cloud"].decode(state, [5, 6])  # the state moves on, as it would bare
    assert torch.equal(logits, tiny_lm.decode(bare, [5, 6]))
    for role in ("device", "cloud"):
        assert observed[role]["cpus"] == sets[role]
        assert observed[role]["engine_threads"] == len(sets[role])  # hf: torch threads per worker
