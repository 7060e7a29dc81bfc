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


def _one_position_at_a_time(tokens, draft, target, seed, first):
    """How the spec cloud verified before the one sampler took whole blocks: one-token
    blocks, each with its position's generator, the bonus drawn at its own position."""
    from tandem.sampling.seeds import PositionDraws, sample_at
    from tandem.sampling.speculative import verify

    for i, token in enumerate(tokens.tolist()):
        draws = PositionDraws(seed, "verify", first + i)
        verdict = verify(torch.tensor([token]), draft[i : i + 1], target[i : i + 2], draws)
        if verdict.num_accepted == 0:
            return i, verdict.next_token
    return len(tokens), sample_at(target[-1], seed, "verify", first + len(tokens))


def test_position_draws_give_a_block_what_one_position_at_a_time_gives():
    """`PositionDraws` makes a block's verdict a function of its positions' draws alone: the
    same verdicts as one-token blocks verified position by position (so blocks of any size,
    and the pipelined spec modes' merged requests, draw the same tokens)."""
    from tandem.sampling.seeds import PositionDraws
    from tandem.sampling.speculative import verify

    generator = torch.Generator().manual_seed(3)
    agree = 0
    for seed in range(200):
        gamma, vocab = 1 + seed % 4, 5
        draft = torch.softmax(torch.randn(gamma, vocab, generator=generator), -1)
        target = torch.softmax(torch.randn(gamma + 1, vocab, generator=generator), -1)
        tokens = torch.multinomial(draft, 1, generator=generator).squeeze(-1)
        first = seed % 7
        block = verify(tokens, draft, target, PositionDraws(seed, "verify", first))
        expected = _one_position_at_a_time(tokens, draft, target, seed, first)
        assert (block.num_accepted, block.next_token) == expected
        agree += block.num_accepted == gamma
    assert 0 < agree < 200  # both full acceptances and rejections were compared
