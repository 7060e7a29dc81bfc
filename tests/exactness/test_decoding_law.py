"""The one autoregressive loop (`tandem.protocols.decoding`): its output law, enumerated on a
4-token vocabulary, is the chain of the model's warped next-token laws, under both seeding
schemes; at temperature 0 it is the argmax chain; it stops where it says."""

from __future__ import annotations

import itertools

import pytest
import torch

from tandem.models.emulated import SleepLM
from tandem.protocols.decoding import decode_steps, position_draw, stream_draw
from tandem.sampling.seeds import position_generator
from tandem.sampling.warp import warp

from .support import assert_chi_square

VOCAB, LENGTH, PROMPT = 4, 3, [1, 2]
SAMPLES = 6000


def lm() -> SleepLM:
    return SleepLM("law", vocab_size=VOCAB, base_s=0.0, per_token_s=0.0, prefill_s=0.0)


def chain_law(model: SleepLM, **sampling) -> torch.Tensor:
    """P(x1..xL) = prod_i warp(logits(prompt + x<i))[x_i], over all VOCAB**LENGTH sequences."""
    law = torch.ones(VOCAB**LENGTH, dtype=torch.float64)
    for index, seq in enumerate(itertools.product(range(VOCAB), repeat=LENGTH)):
        for i, token in enumerate(seq):
            probs = warp(model.row(tuple(PROMPT + list(seq[:i]))), **sampling).double()
            law[index] *= float(probs[token] / probs.sum())
    return law


def index_of(tokens: list[int]) -> int:
    return sum(t * VOCAB ** (LENGTH - 1 - i) for i, t in enumerate(tokens))


def run(model, draw) -> list[int]:
    return list(decode_steps(model, model.prefill(PROMPT), draw, max_new_tokens=LENGTH, eos=None))


@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 3}, {"temperature": 1.3}]
)
@pytest.mark.parametrize("scheme", ["stream", "position"])
def test_sequences_follow_the_chain_of_warped_laws(scheme, sampling):
    model = lm()
    law = chain_law(model, **sampling)
    observed = torch.zeros(VOCAB**LENGTH, dtype=torch.int64)
    for seed in range(SAMPLES):
        draw = (
            stream_draw(seed, **sampling)
            if scheme == "stream"
            else position_draw(seed, "verify", **sampling)
        )
        observed[index_of(run(model, draw))] += 1
    assert_chi_square(observed, law)


def test_temperature_zero_is_the_argmax_chain_under_both_schemes():
    model = lm()
    expected, ids = [], list(PROMPT)
    for _ in range(LENGTH):
        expected.append(int(model.row(tuple(ids)).argmax()))
        ids.append(expected[-1])
    for draw in (stream_draw(5, temperature=0.0), position_draw(5, "x", temperature=0.0)):
        assert run(model, draw) == expected


def test_a_position_draw_does_not_depend_on_the_draws_before_it():
    draw = position_draw(11, "verify", temperature=1.0)
    logits = lm().row((3,))
    later = [draw(logits, p) for p in (5, 0, 2)]
    fresh = position_draw(11, "verify", temperature=1.0)
    assert later == [fresh(logits, p) for p in (5, 0, 2)]
    probs = warp(logits, temperature=1.0)
    assert later[0] == int(
        torch.multinomial(probs.float(), 1, generator=position_generator(11, "verify", 5))
    )


def test_stops_at_eos_yields_it_and_never_feeds_the_last_token():
    model = lm()
    greedy = run(model, stream_draw(0, temperature=0.0))
    state = model.prefill(PROMPT)
    tokens = list(
        decode_steps(model, state, stream_draw(0, temperature=0.0), max_new_tokens=9, eos=greedy[1])
    )
    assert tokens == greedy[: greedy.index(greedy[1]) + 1]
    assert state.seq_len == len(PROMPT) + len(tokens) - 1
    state = model.prefill(PROMPT)
    assert (
        list(
            decode_steps(model, state, stream_draw(0, temperature=0.0), max_new_tokens=0, eos=None)
        )
        == []
    )
    assert state.seq_len == len(PROMPT)
