"""The one decoding core (`tandem.protocols.decoding`): its output law, enumerated on a
4-token vocabulary, with and without a drafter.

- no drafter (plain decoding, `decode_steps`): the chain of the model's warped next-token laws;
- a drafter with the standard rule (SD: RAPID's SD baseline, the StreamingLLM drafter): the
  same chain of the *target's* laws, whatever the drafter proposes;
- a drafter with RAPID's augmented rule in exact mode (laws at the bonus position sent too):
  the chain of p_hat, each built from the target's and the drafter's rows at that prefix.
Block sizes 1-3 over 3 tokens, so rejections, full acceptances and bonus tokens all occur.
At temperature 0 every path is the argmax chain; the loop stops where it says.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tandem.models.emulated import SleepLM
from tandem.protocols.decoding import Rounds, Target, decode_steps, run_rounds
from tandem.protocols.rapid.drafter import ModelDrafter
from tandem.sampling.acceptance import Augmented, Standard
from tandem.sampling.rapid import augmented_from_probs
from tandem.sampling.seeds import sample_at
from tandem.sampling.warp import warp

from .support import assert_chi_square

VOCAB, LENGTH, PROMPT = 4, 3, [1, 2]
SAMPLES = 6000


def lm(name: str = "law") -> SleepLM:
    return SleepLM(name, vocab_size=VOCAB, base_s=0.0, per_token_s=0.0, prefill_s=0.0)


def chain_law(position_law) -> torch.Tensor:
    """P(x1..xL) = prod_i position_law(prompt + x<i)[x_i] over all VOCAB**LENGTH sequences."""
    law = torch.ones(VOCAB**LENGTH, dtype=torch.float64)
    for index, seq in enumerate(itertools.product(range(VOCAB), repeat=LENGTH)):
        for i, token in enumerate(seq):
            probs = position_law(tuple(PROMPT + list(seq[:i]))).double()
            law[index] *= float(probs[token] / probs.sum())
    return law


def index_of(tokens: list[int]) -> int:
    return sum(t * VOCAB ** (LENGTH - 1 - i) for i, t in enumerate(tokens))


def plain(model: SleepLM, seed: int, **sampling) -> list[int]:
    steps = decode_steps(
        model, model.prefill(PROMPT), seed=seed, **sampling, max_new_tokens=LENGTH, eos=None
    )
    return list(steps)


def speculative(target: SleepLM, drafter: SleepLM, seed: int, gamma: int, rule, bonus_row):
    verifier = Target(target, target.prefill(PROMPT), seed=seed, temperature=1.0, rule=rule)
    proposer = ModelDrafter(
        drafter, drafter.prefill(PROMPT), seed=seed, temperature=1.0, bonus_row=bonus_row
    )
    rounds = Rounds(gamma=gamma, max_new_tokens=LENGTH, eos=None)
    return [t for new in run_rounds(verifier, proposer, rounds) for t in new]


@pytest.mark.parametrize(
    "sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 3}, {"temperature": 1.3}]
)
def test_plain_decoding_follows_the_chain_of_warped_laws(sampling):
    model = lm()
    law = chain_law(lambda ids: warp(model.row(ids), **sampling))
    observed = torch.zeros(VOCAB**LENGTH, dtype=torch.int64)
    for seed in range(SAMPLES):
        observed[index_of(plain(model, seed, **sampling))] += 1
    assert_chi_square(observed, law)


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_standard_rule_rounds_follow_the_target_chain(gamma):
    target, drafter = lm(), lm("drafter")
    law = chain_law(lambda ids: warp(target.row(ids), temperature=1.0))
    observed = torch.zeros(VOCAB**LENGTH, dtype=torch.int64)
    for seed in range(SAMPLES):
        tokens = speculative(target, drafter, seed, gamma, Standard(), bonus_row=False)
        observed[index_of(tokens)] += 1
    assert_chi_square(observed, law)


@pytest.mark.parametrize("gamma", [1, 2])
def test_augmented_exact_rounds_follow_the_chain_of_p_hat(gamma):
    target, drafter = lm(), lm("drafter")
    rule = Augmented(eta=3.0)

    def p_hat(ids):
        q = warp(drafter.row(ids), temperature=1.0)
        return augmented_from_probs(warp(target.row(ids), temperature=1.0), q, rule.eta)

    law = chain_law(p_hat)
    observed = torch.zeros(VOCAB**LENGTH, dtype=torch.int64)
    for seed in range(SAMPLES):
        observed[index_of(speculative(target, drafter, seed, gamma, rule, bonus_row=True))] += 1
    assert_chi_square(observed, law)


def test_temperature_zero_is_the_argmax_chain_with_or_without_a_drafter():
    model, expected, ids = lm(), [], list(PROMPT)
    for _ in range(LENGTH):
        expected.append(int(model.row(tuple(ids)).argmax()))
        ids.append(expected[-1])
    assert plain(model, 5, temperature=0.0) == expected
    for gamma in (1, 2, 3):
        verifier = Target(model, model.prefill(PROMPT), seed=5, temperature=0.0)
        proposer = ModelDrafter(lm("d"), lm("d").prefill(PROMPT), seed=5, temperature=0.0)
        rounds = Rounds(gamma=gamma, max_new_tokens=LENGTH, eos=None)
        assert [t for new in run_rounds(verifier, proposer, rounds) for t in new] == expected


def test_the_token_at_a_position_is_that_positions_draw():
    """Plain decoding draws position p with the generator of (seed, "verify", p) alone: the
    first token is `sample_at` on the prompt's row, whatever else was drawn."""
    model = lm()
    for seed in range(20):
        first = sample_at(warp(model.row(tuple(PROMPT)), temperature=1.0), seed, "verify", 0)
        assert plain(model, seed, temperature=1.0)[0] == first


def test_stops_at_eos_yields_it_and_never_feeds_the_last_token():
    model = lm()
    greedy = plain(model, 0, temperature=0.0)
    state = model.prefill(PROMPT)
    tokens = list(
        decode_steps(model, state, seed=0, temperature=0.0, max_new_tokens=9, eos=greedy[1])
    )
    assert tokens == greedy[: greedy.index(greedy[1]) + 1]
    assert state.seq_len == len(PROMPT) + len(tokens) - 1
    state = model.prefill(PROMPT)
    assert (
        list(decode_steps(model, state, seed=0, temperature=0.0, max_new_tokens=0, eos=None)) == []
    )
    assert state.seq_len == len(PROMPT)
