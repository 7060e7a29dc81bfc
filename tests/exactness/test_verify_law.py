"""Speculative block verification reproduces the target chain exactly.

The enumeration below is written from the algorithm's statement (accept with
min(1, target/draft), resample from norm(max(0, target - draft)), bonus from the last row),
not from tandem's helpers; the chi-square tests then check that the real `verify_batch`
draws from the enumerated law.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from tandem.sampling import speculative
from tandem.sampling.warp import sample, warp

from .support import (
    KINDS,
    LAW_TOLERANCE,
    NUM_SAMPLES,
    all_sequences,
    assert_chi_square,
    counts,
    law_pair,
    max_abs,
)

RowFn = Callable[[tuple[int, ...]], torch.Tensor]


def block_law(prefix, gamma, vocab, draft_fn: RowFn, target_fn: RowFn) -> dict:
    """Law of the tokens one block emits after `prefix`, enumerating every draft sequence."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for drafts in all_sequences(vocab, gamma):
        draft_rows = [draft_fn(prefix + drafts[:i]) for i in range(gamma)]
        target_rows = [target_fn(prefix + drafts[:i]) for i in range(gamma + 1)]
        reach = 1.0
        for i, token in enumerate(drafts):
            reach *= float(draft_rows[i][token])
        for i, token in enumerate(drafts):
            if reach == 0.0:
                break
            accept = min(1.0, float(target_rows[i][token]) / float(draft_rows[i][token]))
            if accept < 1.0:
                excess = (target_rows[i] - draft_rows[i]).clamp_min(0.0)
                for y in range(vocab):
                    law[drafts[:i] + (y,)] += (
                        reach * (1.0 - accept) * float(excess[y] / excess.sum())
                    )
            reach *= accept
        for y in range(vocab):
            law[drafts + (y,)] += reach * float(target_rows[gamma][y])
    return law


def sequence_law(prefix, length, gamma, vocab, draft_fn: RowFn, target_fn: RowFn) -> dict:
    """Law of the next `length` tokens when verify blocks are run back to back."""
    if length == 0:
        return {(): 1.0}
    law: dict[tuple[int, ...], float] = defaultdict(float)
    for emitted, weight in block_law(prefix, gamma, vocab, draft_fn, target_fn).items():
        if len(emitted) >= length:
            law[emitted[:length]] += weight
            continue
        rest_law = sequence_law(
            prefix + emitted, length - len(emitted), gamma, vocab, draft_fn, target_fn
        )
        for rest, rest_weight in rest_law.items():
            law[emitted + rest] += weight * rest_weight
    return law


def chain_law(prefix, length, vocab, target_fn: RowFn) -> dict:
    law = {}
    for tokens in all_sequences(vocab, length):
        weight = 1.0
        for i, token in enumerate(tokens):
            weight *= float(target_fn(prefix + tokens[:i])[token])
        law[tokens] = weight
    return law


def assert_same_law(found: dict, expected: dict) -> None:
    keys = set(found) | set(expected)
    error = max(abs(found.get(k, 0.0) - expected.get(k, 0.0)) for k in keys)
    assert error <= LAW_TOLERANCE, error
    assert abs(sum(found.values()) - 1.0) <= LAW_TOLERANCE


def prefix_rows(vocab: int, seed: int) -> tuple[RowFn, RowFn]:
    """Draft and target rows that depend on the whole prefix, with a varying relationship."""
    cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def pair(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in cache:
            generator = torch.Generator().manual_seed(seed * 7919 + hash(prefix) % 1_000_003)
            kind = KINDS[int(torch.randint(len(KINDS), (1,), generator=generator))]
            cache[prefix] = law_pair(kind, vocab, generator)
        return cache[prefix]

    return (lambda prefix: pair(prefix)[0]), (lambda prefix: pair(prefix)[1])


def fixed_rows(gamma: int, vocab: int, kinds: tuple[str, ...], seed: int):
    """Rows depending only on the position: draft [gamma, V], target [gamma + 1, V]."""
    generator = torch.Generator().manual_seed(seed)
    pairs = [law_pair(kind, vocab, generator) for kind in kinds]
    assert len(pairs) == gamma + 1
    draft_rows = torch.stack([d for d, _ in pairs[:gamma]])
    target_rows = torch.stack([t for _, t in pairs])
    return draft_rows, target_rows


FIXED_CASES = [
    (1, 3, ("random", "random"), 1),
    (2, 4, ("sparse", "disjoint", "random"), 2),
    (3, 5, ("random", "one-hot-first", "equal", "peaked"), 3),
    (3, 6, ("peaked", "one-hot-second", "sparse", "random"), 4),
    (2, 3, ("equal", "equal", "random"), 5),
    (3, 4, ("disjoint", "random", "random", "sparse"), 6),
]


@pytest.mark.parametrize("gamma,vocab,length,seed", [(1, 4, 3, 0), (2, 3, 3, 1), (3, 3, 2, 2)])
def test_back_to_back_blocks_follow_prefix_dependent_target_chain(gamma, vocab, length, seed):
    draft_fn, target_fn = prefix_rows(vocab, seed)
    found = sequence_law((), length, gamma, vocab, draft_fn, target_fn)
    assert_same_law(found, chain_law((), length, vocab, target_fn))


@pytest.mark.parametrize("gamma,vocab,kinds,seed", FIXED_CASES)
def test_first_two_positions_follow_fixed_target_rows(gamma, vocab, kinds, seed):
    draft_rows, target_rows = fixed_rows(gamma, vocab, kinds, seed)

    def draft_fn(prefix):
        return draft_rows[min(len(prefix), gamma - 1)]

    def target_fn(prefix):
        return target_rows[min(len(prefix), gamma)]

    found = sequence_law((), 2, gamma, vocab, draft_fn, target_fn)
    assert_same_law(found, chain_law((), 2, vocab, target_fn))


def test_helpers_agree_with_enumeration_on_random_laws():
    generator = torch.Generator().manual_seed(11)
    for trial in range(300):
        vocab = 3 + trial % 4
        draft_probs, target_probs = law_pair(KINDS[trial % len(KINDS)], vocab, generator)
        law = speculative.position_law(draft_probs, target_probs)
        assert max_abs(law, target_probs) <= LAW_TOLERANCE
        tokens = torch.arange(vocab)
        accept = speculative.acceptance_probs(
            tokens.unsqueeze(-1),
            draft_probs.expand(vocab, 1, vocab),
            target_probs.expand(vocab, 1, vocab),
        ).squeeze(-1)
        drafted = draft_probs > 0
        expected = (target_probs[drafted] / draft_probs[drafted]).clamp(max=1.0)
        assert max_abs(accept[drafted], expected) <= LAW_TOLERANCE


def run_blocks(draft_rows, target_rows, generator) -> speculative.BatchVerdict:
    gamma, vocab = draft_rows.shape
    drafts = sample(draft_rows.expand(NUM_SAMPLES, gamma, vocab), generator)  # [n, gamma]
    return speculative.verify_batch(
        drafts,
        draft_rows.expand(NUM_SAMPLES, gamma, vocab),
        target_rows.expand(NUM_SAMPLES, gamma + 1, vocab),
        generator,
    )


@pytest.mark.parametrize("gamma,vocab,kinds,seed", FIXED_CASES)
def test_verify_batch_draws_the_enumerated_outcome_law(gamma, vocab, kinds, seed):
    """Chi-square on the joint (num_accepted, next_token) cells."""
    draft_rows, target_rows = fixed_rows(gamma, vocab, kinds, seed)
    law = torch.zeros(gamma + 1, vocab, dtype=torch.float64)
    for emitted, weight in block_law(
        (), gamma, vocab, lambda p: draft_rows[len(p)], lambda p: target_rows[len(p)]
    ).items():
        law[len(emitted) - 1, emitted[-1]] += weight
    verdicts = run_blocks(draft_rows, target_rows, torch.Generator().manual_seed(100 + seed))
    cells = verdicts.num_accepted * vocab + verdicts.next_token
    assert_chi_square(counts(cells, (gamma + 1) * vocab), law)
    assert bool((verdicts.is_bonus == (verdicts.num_accepted == gamma)).all())


@pytest.mark.parametrize("gamma,vocab,kinds,seed", FIXED_CASES)
def test_verify_batch_first_two_tokens_follow_target(gamma, vocab, kinds, seed):
    """Blocks that emit one token are continued by a second block from position 1."""
    draft_rows, target_rows = fixed_rows(gamma, vocab, kinds, seed)
    generator = torch.Generator().manual_seed(200 + seed)
    first = run_blocks(draft_rows, target_rows, generator)
    second_rows = (
        torch.cat([draft_rows[1:], draft_rows[-1:]]),
        torch.cat([target_rows[1:], target_rows[-1:]]),
    )
    second = run_blocks(*second_rows, generator)
    one_token = first.num_accepted == 0
    token_1 = torch.where(one_token, first.next_token, first.draft_tokens[:, 0])
    token_2_in_block = torch.where(
        first.num_accepted == 1, first.next_token, first.draft_tokens[:, min(1, gamma - 1)]
    )
    token_2_next_block = torch.where(
        second.num_accepted == 0, second.next_token, second.draft_tokens[:, 0]
    )
    token_2 = torch.where(one_token, token_2_next_block, token_2_in_block)
    expected = torch.outer(target_rows[0], target_rows[1])
    assert_chi_square(counts(token_1 * vocab + token_2, vocab * vocab), expected)


def test_verify_is_the_one_block_view_of_verify_batch():
    draft_rows, target_rows = fixed_rows(3, 5, ("random", "sparse", "peaked", "random"), 9)
    for seed in range(20):
        drafts = sample(draft_rows, torch.Generator().manual_seed(seed))
        one = speculative.verify(
            drafts, draft_rows, target_rows, torch.Generator().manual_seed(seed)
        )
        batch = speculative.verify_batch(
            drafts.unsqueeze(0),
            draft_rows.unsqueeze(0),
            target_rows.unsqueeze(0),
            torch.Generator().manual_seed(seed),
        )
        assert one == batch.row(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_greedy_blocks_are_plain_greedy_for_every_draft_sequence(dtype):
    """Targets forced one-hot with +-100 logits: verify equals greedy decoding of the target."""
    gamma, vocab = 3, 4
    generator = torch.Generator().manual_seed(5)
    argmax = torch.randint(vocab, (gamma + 1,), generator=generator)
    logits = torch.full((gamma + 1, vocab), -100.0, dtype=dtype)
    logits[torch.arange(gamma + 1), argmax] = 100.0
    target_rows = warp(logits)
    draft_rows = torch.softmax(torch.randn(gamma, vocab, generator=generator, dtype=dtype), -1)
    for drafts in all_sequences(vocab, gamma):
        drafts = torch.tensor(drafts)
        matches = (drafts == argmax[:gamma]).to(torch.int64).cumprod(0)
        expected_accepted = int(matches.sum())
        for seed in range(3):
            verdict = speculative.verify(
                drafts, draft_rows, target_rows, torch.Generator().manual_seed(seed)
            )
            assert verdict.num_accepted == expected_accepted
            assert verdict.next_token == int(argmax[expected_accepted])
