from __future__ import annotations

import math

import pytest
import torch

from tandem.errors import TandemError
from tandem.sampling import acceptance, rapid
from tandem.sampling.warp import warp


def rapid_verify(tokens, draft, logits, draws, *, eta, temperature, mode="exact"):
    """One block under RAPID's rule on the one sampler, from the target's logits."""
    target = warp(logits.to(draft.dtype), temperature=temperature)
    rule = acceptance.Augmented(eta=eta, mode=mode)
    return acceptance.judge(rule, tokens, draft, target, draws)[0]


def vec(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def softmax(values: list[float]) -> list[float]:
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


@pytest.mark.parametrize("tail", rapid.TAIL_RULES)
def test_no_transfer_gives_the_target(tail):
    logits, draft = vec(1.0, -0.5, 0.3, 2.0), vec(0.7, 0.1, 0.1, 0.1)
    out = rapid.augmented_target(logits, draft, 0.0, 0.8, tail=tail)
    assert torch.allclose(out, torch.softmax(logits / 0.8, -1))


def test_eq6_by_hand():
    logits, draft, eta, temperature = [1.0, 0.0, -1.0], [0.2, 0.5, 0.3], 2.0, 0.5
    target = softmax([z / temperature for z in logits])
    expected = softmax(
        [z / temperature + eta * (q - p) for z, q, p in zip(logits, draft, target, strict=True)]
    )
    out = rapid.augmented_target(vec(*logits), vec(*draft), eta, temperature, tail="none")
    assert torch.allclose(out, vec(*expected), atol=1e-12)


def test_eq9_paper_tail_takes_back_target_mass_then_renormalises():
    logits, draft, eta = vec(3.0, 0.0, 0.0, -1.0), vec(0.05, 0.9, 0.0, 0.05), 3.0
    shifted = rapid.augmented_target(logits, draft, eta, 1.0, tail="none")
    target = torch.softmax(logits, -1)
    in_tail = shifted < 0.1 * shifted.max()
    assert in_tail.tolist() == [False, False, True, True]  # the case exercises the rule
    out = rapid.augmented_target(logits, draft, eta, 1.0, tail="paper")
    assert abs(float(out.sum()) - 1.0) < 1e-12
    unnormalised = torch.where(in_tail, target, shifted)
    assert torch.allclose(out, unnormalised / unnormalised.sum())


def test_code_tail_shifts_only_the_drafter_head():
    logits, draft, eta = vec(0.5, 0.0, 1.0, -1.0), vec(0.6, 0.39, 0.005, 0.005), 5.0
    out = rapid.augmented_target(logits, draft, eta, 1.0, tail="code")
    # Tokens 2 and 3 (q < 0.1 max q) keep their logits: their ratio is untouched.
    assert float(out[2] / out[3]) == pytest.approx(math.exp(2.0))
    target = torch.softmax(logits, -1)
    head_logits = logits[:2] + eta * (draft[:2] - target[:2])
    assert float(out[0] / out[1]) == pytest.approx(math.exp(float(head_logits[0] - head_logits[1])))


def test_temperature_zero_and_masked_logits():
    logits, draft = vec(0.1, 2.0, 1.9), vec(0.0, 0.0, 1.0)
    assert rapid.augmented_target(logits, draft, 50.0, 0.0).tolist() == [0.0, 1.0, 0.0]
    masked = vec(0.1, float("-inf"), 1.9)
    out = rapid.augmented_target(masked, vec(0.0, 1.0, 0.0), 20.0, 1.0)
    assert float(out[1]) == 0.0 and abs(float(out.sum()) - 1.0) < 1e-12


def test_paper_residual_is_eq10_clipped():
    draft, target, augmented = vec(0.5, 0.5, 0.0), vec(0.2, 0.1, 0.7), vec(0.6, 0.3, 0.1)
    expected = torch.clamp(torch.maximum(target - augmented, target - draft), min=0.0)
    assert torch.allclose(rapid.paper_residual(draft, target, augmented), expected / expected.sum())


def test_unknown_mode_and_tail_raise():
    logits, draft = torch.zeros(2, 3), torch.full((1, 3), 1 / 3)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(TandemError):
        rapid_verify(
            torch.tensor([0]), draft, logits, generator, eta=1.0, temperature=1.0, mode="x"
        )
    with pytest.raises(TandemError):
        rapid.augmented_target(logits[0], draft[0], 1.0, 1.0, tail="x")


def test_verify_accepts_both_draft_row_counts_and_float32():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 6, generator=generator)
    draft = torch.softmax(torch.randn(3, 6, generator=generator), -1)
    tokens = torch.tensor([1, 4])
    for rows in (2, 3):
        for mode in rapid.MODES:
            verdict = rapid_verify(
                tokens, draft[:rows], logits, generator, eta=5.0, temperature=1.0, mode=mode
            )
            assert 0 <= verdict.num_accepted <= 2 and 0 <= verdict.next_token < 6
    with pytest.raises(AssertionError):
        rapid_verify(tokens, draft[:1], logits, generator, eta=5.0, temperature=1.0)


def test_drafter_that_agrees_with_target_is_always_accepted():
    logits = vec(0.2, 1.0, -0.4)
    draft = torch.softmax(logits, -1)  # q == p, so p_hat == p and min(1, p_hat/q) == 1
    for mode in rapid.MODES:
        for seed in range(5):
            verdict = rapid_verify(
                torch.tensor([seed % 3]),
                draft.unsqueeze(0),
                logits.expand(2, 3),
                torch.Generator().manual_seed(seed),
                eta=20.0,
                temperature=1.0,
                mode=mode,
            )
            assert verdict.num_accepted == 1
