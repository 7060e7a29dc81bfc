from __future__ import annotations

import dataclasses

import pytest
import torch

from tandem.sampling import speculative


def rows(*values: list[float], dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_acceptance_probs_edges():
    draft = rows([0.5, 0.5, 0.0], [0.2, 0.2, 0.6], [0.0, 1.0, 0.0])
    target = rows([0.25, 0.75, 0.0], [0.4, 0.0, 0.6], [0.5, 0.5, 0.0], [1.0, 0.0, 0.0])
    # token 0: 0.25/0.5; token 1 has target 0; token 0 was impossible for the drafter.
    accept = speculative.acceptance_probs(torch.tensor([0, 1, 0]), draft, target)
    assert accept.tolist() == [0.5, 0.0, 1.0]


def test_residual_is_positive_part_and_falls_back_on_equal_rows():
    draft = rows([0.5, 0.5, 0.0], [0.2, 0.3, 0.5])
    target = rows([0.25, 0.25, 0.5], [0.2, 0.3, 0.5])
    out = speculative.residual(draft, target)
    assert torch.allclose(out, rows([0.0, 0.0, 1.0], [0.2, 0.3, 0.5]))


def test_equal_laws_accept_every_draft():
    law = rows([0.2, 0.3, 0.5])
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        drafts = torch.multinomial(law[0], 3, replacement=True, generator=generator)
        verdict = speculative.verify(drafts, law.expand(3, 3), law.expand(4, 3), generator)
        assert verdict.num_accepted == 3 and verdict.is_bonus
        assert verdict.tokens == (*drafts.tolist(), verdict.next_token)


def test_disjoint_laws_reject_first_draft_and_recover_from_target():
    draft = rows([0.5, 0.5, 0.0, 0.0]).expand(2, 4)
    target = rows([0.0, 0.0, 0.3, 0.7]).expand(3, 4)
    for seed in range(20):
        verdict = speculative.verify(
            torch.tensor([seed % 2, 1]), draft, target, torch.Generator().manual_seed(seed)
        )
        assert verdict.num_accepted == 0 and not verdict.is_bonus
        assert verdict.accepted_tokens == () and verdict.next_token in (2, 3)


def test_gamma_zero_samples_the_bonus_row():
    target = rows([0.0, 1.0, 0.0])
    verdict = speculative.verify(
        torch.zeros(0, dtype=torch.int64),
        torch.zeros(0, 3, dtype=torch.float64),
        target,
        torch.Generator().manual_seed(0),
    )
    assert verdict == speculative.Verdict(
        num_accepted=0, next_token=1, is_bonus=True, accepted_tokens=()
    )


def test_given_residual_replaces_the_standard_one():
    draft = rows([0.0, 1.0, 0.0]).expand(1, 3)
    target = rows([0.5, 0.0, 0.5], [1.0, 0.0, 0.0])
    override = rows([[0.0, 0.0, 1.0]])  # [batch=1, gamma=1, vocab]
    for seed in range(10):
        out = speculative.verify_batch(
            torch.tensor([[1]]),
            draft.unsqueeze(0),
            target.unsqueeze(0),
            torch.Generator().manual_seed(seed),
            residual_probs=override,
        )
        assert (int(out.num_accepted[0]), int(out.next_token[0])) == (0, 2)


def test_float32_inputs_and_batch_rows():
    generator = torch.Generator().manual_seed(3)
    draft = torch.softmax(torch.randn(8, 2, 5, generator=generator), -1)
    target = torch.softmax(torch.randn(8, 3, 5, generator=generator), -1)
    drafts = torch.randint(5, (8, 2), generator=generator)
    out = speculative.verify_batch(drafts, draft, target, generator)
    assert out.num_accepted.dtype == torch.int64 and out.next_token.shape == (8,)
    assert ((out.num_accepted >= 0) & (out.num_accepted <= 2)).all()
    row = out.row(5)
    assert row.accepted_tokens == tuple(drafts[5, : row.num_accepted].tolist())


def test_verdict_is_frozen():
    verdict = speculative.Verdict(
        num_accepted=1, next_token=2, is_bonus=False, accepted_tokens=(4,)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.num_accepted = 2  # type: ignore[misc]


def test_shapes_are_checked():
    generator = torch.Generator().manual_seed(0)
    draft = rows([0.5, 0.5]).expand(2, 2)
    with pytest.raises(AssertionError):  # target needs gamma + 1 rows
        speculative.verify(torch.tensor([0, 1]), draft, rows([0.5, 0.5]).expand(2, 2), generator)
    with pytest.raises(AssertionError):
        speculative.verify(
            torch.tensor([0, 1]), draft[:1], rows([0.5, 0.5]).expand(3, 2), generator
        )


def test_verify_greedy_is_the_samplers_greedy_path():
    """On raw logits full of ties (small integers), at every block size 0-5 and every depth
    of agreement, `verify_greedy` gives `verify`'s verdict on `warp(logits, temperature=0)`."""
    from tandem.sampling.warp import warp

    gen = torch.Generator().manual_seed(3)
    checked = 0
    for _ in range(300):
        gamma = int(torch.randint(0, 6, (1,), generator=gen))
        vocab = int(torch.randint(2, 9, (1,), generator=gen))
        logits = torch.randint(-3, 3, (gamma + 1, vocab), generator=gen).float()  # ties
        argmax = logits.argmax(dim=-1)
        drafts = torch.randint(0, vocab, (gamma,), generator=gen)
        agree = int(torch.randint(0, gamma + 1, (1,), generator=gen))
        drafts[:agree] = argmax[:agree]  # the first `agree` drafts pass, the rest by chance
        draft_probs = torch.softmax(torch.randn(gamma, vocab, generator=gen), dim=-1)
        expected = speculative.verify(drafts, draft_probs, warp(logits, temperature=0.0), gen)
        assert speculative.verify_greedy(drafts, logits) == expected, (logits, drafts)
        checked += expected.num_accepted > 0 and not expected.is_bonus
    assert checked > 20  # partial acceptances were among the cases
