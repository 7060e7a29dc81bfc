"""RAPID verification: `exact` mode emits the augmented target p_hat; `paper` mode emits the
law its own residual (Eq. 10) produces, which is neither p nor p_hat (DESIGN errata 1).

The enumeration renders each mode from its statement: accept the draft x ~ q with
min(1, p_hat(x)/q(x)); on rejection draw from norm(max(0, p_hat - q)) (exact) or
norm(max(p - p_hat, p - q, 0)) (paper, Algorithm 1 line 26). p_hat comes from
`rapid.augmented_target`, which tests/sampling/test_rapid.py checks against Eq. 6 and 9.
"""

from __future__ import annotations

import pytest
import torch

from tandem.sampling import rapid
from tandem.sampling.warp import sample, warp

from .support import (
    LAW_TOLERANCE,
    NUM_SAMPLES,
    all_sequences,
    assert_chi_square,
    counts,
    dirichlet,
    law_pair,
    max_abs,
    rapid_verify_batch,
    total_variation,
)


def stated_residual(mode: str, draft, target, augmented) -> torch.Tensor:
    if mode == "exact":
        excess = (augmented - draft).clamp_min(0.0)
        fallback = augmented
    else:
        excess = torch.maximum(torch.maximum(target - augmented, target - draft), torch.zeros(()))
        fallback = target
    return excess / excess.sum() if float(excess.sum()) > 0 else fallback


def enumerated_position_law(mode, draft, target, augmented) -> torch.Tensor:
    law = torch.zeros_like(draft)
    residual = stated_residual(mode, draft, target, augmented)
    for x in range(draft.shape[0]):
        if draft[x] == 0:
            continue
        accept = min(1.0, float(augmented[x] / draft[x]))
        law[x] += draft[x] * accept
        law += draft[x] * (1.0 - accept) * residual
    return law


def enumerated_block(mode, draft_rows, target_rows, augmented_rows, bonus) -> torch.Tensor:
    """[num_accepted, next_token] law of one block with rows fixed per position."""
    gamma, vocab = draft_rows.shape
    law = torch.zeros(gamma + 1, vocab, dtype=torch.float64)
    residuals = [
        stated_residual(mode, draft_rows[i], target_rows[i], augmented_rows[i])
        for i in range(gamma)
    ]
    for drafts in all_sequences(vocab, gamma):
        reach = float(torch.prod(draft_rows[torch.arange(gamma), torch.tensor(drafts)]))
        for i, x in enumerate(drafts):
            if reach == 0.0:
                break
            accept = min(1.0, float(augmented_rows[i][x] / draft_rows[i][x]))
            law[i] += reach * (1.0 - accept) * residuals[i]
            reach *= accept
        law[gamma] += reach * bonus
    return law


def random_position(vocab, generator, kind="random"):
    target_logits = 2.0 * torch.randn(vocab, generator=generator, dtype=torch.float64)
    draft, _ = law_pair(kind, vocab, generator)
    return target_logits, draft


@pytest.mark.parametrize("tail", ["paper", "code", "none"])
@pytest.mark.parametrize("mode", ["exact", "paper"])
def test_output_law_matches_enumeration_on_random_laws(mode, tail):
    generator = torch.Generator().manual_seed(3)
    kinds = ("random", "sparse", "one-hot-first", "peaked")
    for trial in range(200):
        vocab = 3 + trial % 4
        target_logits, draft = random_position(vocab, generator, kinds[trial % len(kinds)])
        eta = (0.0, 1.0, 5.0, 20.0)[trial % 4]
        temperature = (1.0, 0.7)[trial % 2]
        augmented = rapid.augmented_target(target_logits, draft, eta, temperature, tail=tail)
        target = warp(target_logits, temperature=temperature)
        law = rapid.output_law(draft, target_logits, eta, temperature, mode=mode, tail=tail)
        assert (
            max_abs(law, enumerated_position_law(mode, draft, target, augmented)) <= LAW_TOLERANCE
        )
        if mode == "exact":
            assert max_abs(law, augmented) <= LAW_TOLERANCE
        if eta == 0.0:  # no transfer: both modes are standard speculative sampling of p
            assert max_abs(law, target) <= LAW_TOLERANCE


def test_paper_mode_law_differs_from_both_target_and_augmented_target():
    """A hand-sized case (worked in docs/exactness.md): the claimed law p is far off."""
    target_logits = torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)
    draft = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    target = warp(target_logits)
    augmented = rapid.augmented_target(target_logits, draft, 5.0, 1.0)
    law = rapid.output_law(draft, target_logits, 5.0, 1.0, mode="paper")
    expected = {"target": [0.787, 0.107, 0.107], "augmented": [0.177, 0.720, 0.102]}
    assert max_abs(target, torch.tensor(expected["target"], dtype=torch.float64)) < 1e-3
    assert max_abs(augmented, torch.tensor(expected["augmented"], dtype=torch.float64)) < 1e-3
    assert max_abs(law, torch.tensor([0.452, 0.5, 0.048], dtype=torch.float64)) < 1e-3
    assert total_variation(law, target) > 0.39
    assert total_variation(law, augmented) > 0.27
    # Where the clip bites: p - min(q, p_hat) is negative for the drafter's favourite token.
    assert float(target[1] - torch.minimum(draft, augmented)[1]) < -0.39


BLOCK_CASES = [
    ("exact", 2, 4, 5.0, 1.0, False, 1),
    ("exact", 3, 3, 20.0, 0.8, True, 2),
    ("exact", 2, 5, 1.0, 1.0, True, 3),
    ("paper", 2, 4, 5.0, 1.0, False, 4),
    ("paper", 3, 3, 20.0, 0.8, True, 5),
    ("paper", 2, 5, 10.0, 1.0, False, 6),
]


@pytest.mark.parametrize("mode,gamma,vocab,eta,temperature,bonus_draft,seed", BLOCK_CASES)
def test_verify_batch_draws_the_enumerated_block_law(
    mode, gamma, vocab, eta, temperature, bonus_draft, seed
):
    generator = torch.Generator().manual_seed(seed)
    target_logits = 2.0 * torch.randn(gamma + 1, vocab, generator=generator, dtype=torch.float64)
    draft_rows = torch.stack([dirichlet(vocab, generator) for _ in range(gamma + 1)])
    draft_rows[0] = law_pair("sparse", vocab, generator)[0]  # a zero in the draft law
    given = draft_rows if bonus_draft else draft_rows[:gamma]
    target_rows = warp(target_logits, temperature=temperature)
    augmented = rapid.augmented_target(target_logits, draft_rows, eta, temperature)
    bonus = augmented[gamma] if (mode == "exact" and bonus_draft) else target_rows[gamma]
    law = enumerated_block(mode, draft_rows[:gamma], target_rows, augmented, bonus)
    drafts = sample(draft_rows[:gamma].expand(NUM_SAMPLES, gamma, vocab), generator)
    verdicts = rapid_verify_batch(
        drafts,
        given.expand(NUM_SAMPLES, *given.shape),
        target_logits.expand(NUM_SAMPLES, gamma + 1, vocab),
        generator,
        eta=eta,
        temperature=temperature,
        mode=mode,
    )
    cells = verdicts.num_accepted * vocab + verdicts.next_token
    assert_chi_square(counts(cells, (gamma + 1) * vocab), law)
    # The first emitted token follows the per-position law.
    first = torch.where(verdicts.num_accepted == 0, verdicts.next_token, drafts[:, 0])
    position = rapid.output_law(draft_rows[0], target_logits[0], eta, temperature, mode=mode)
    assert_chi_square(counts(first, vocab), position)


@pytest.mark.parametrize("mode", ["exact", "paper"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_greedy_rapid_is_plain_greedy_of_the_target(mode, temperature):
    """+-100 target logits (temperature 1) or temperature 0: deterministic argmax chain."""
    gamma, vocab = 2, 4
    generator = torch.Generator().manual_seed(8)
    argmax = torch.randint(vocab, (gamma + 1,), generator=generator)
    target_logits = torch.full((gamma + 1, vocab), -100.0, dtype=torch.float64)
    if temperature == 0.0:
        target_logits = torch.randn(gamma + 1, vocab, generator=generator, dtype=torch.float64)
        argmax = target_logits.argmax(dim=-1)
    target_logits[torch.arange(gamma + 1), argmax] = 100.0
    draft_rows = torch.stack([dirichlet(vocab, generator) for _ in range(gamma)])
    for drafts in all_sequences(vocab, gamma):
        drafts = torch.tensor(drafts)
        accepted = int((drafts == argmax[:gamma]).to(torch.int64).cumprod(0).sum())
        for seed in range(3):
            verdict = rapid_verify_batch(
                drafts[None],
                draft_rows[None],
                target_logits[None],
                torch.Generator().manual_seed(seed),
                eta=10.0,
                temperature=temperature,
                mode=mode,
            ).row(0)
            assert (verdict.num_accepted, verdict.next_token) == (accepted, int(argmax[accepted]))
