"""The per-position seed scheme is fixed: every committed sampled result and every exact
mode's agreement with its baseline depends on it, so a change must show up here."""

from __future__ import annotations

import torch

from tandem.sampling.seeds import position_generator, position_seed


def test_seeds_are_the_documented_blake2b_values():
    # blake2b-64 of "seed:purpose:position", little-endian, shifted to 63 bits (computed once
    # when the spec and DRAGON copies of this function were merged into one).
    assert position_seed(0, "verify", 0) == 1319961522614158295
    assert position_seed(7, "device", 12) == 2458888392512406067


def test_a_generator_depends_only_on_seed_purpose_and_position():
    draws = {
        key: torch.rand(3, generator=position_generator(*key)).tolist()
        for key in [(1, "verify", 4), (1, "verify", 5), (1, "draft", 4), (2, "verify", 4)]
    }
    assert len({tuple(v) for v in draws.values()}) == 4
    assert (
        torch.rand(3, generator=position_generator(1, "verify", 4)).tolist()
        == draws[(1, "verify", 4)]
    )
