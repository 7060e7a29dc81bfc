"""RAPID: the retrieval-augmented target and its verification (paper Sec. 2.4, Eq. 6, 9, 10).

Words used here:
- *target_logits* z: the long-context target's logits; *target_probs* p = softmax(z / T).
- *draft_probs* q: the RAG drafter's law, the one its draft tokens were drawn from.
- *eta*: strength of the knowledge transfer from drafter to target.
- *augmented_probs* p_hat: the retrieval-augmented target, softmax(z / T + eta (q - p)) (Eq. 6)
  followed by a *tail rule* (Eq. 9):
    "paper": Eq. 9 as printed: every token whose p_hat is below `tail_ratio` (0.1) times the
             largest p_hat takes its original p back. The paper does not renormalise the
             result; we do, so p_hat is a law.
    "code":  what the authors' public code does instead (John-AI-Lab/RAPID,
             `_speculative_sampling`): the shift eta (q - p) is applied only to tokens where
             q >= tail_ratio * max(q) (the drafter's head); the rest keep z / T; softmax.
    "none":  Eq. 6 alone.
- *mode*:
    "exact": speculative sampling against p_hat: accept min(1, p_hat / q), residual
             norm(max(0, p_hat - q)). Output law: exactly p_hat. The bonus position follows
             p_hat when the drafter's law there is given (gamma + 1 draft rows), else p.
    "paper": accept min(1, p_hat / q) (Eq. 5 with p_hat), residual
             norm(max(p - p_hat, p - q, 0)) (Eq. 10 with Algorithm 1 line 26's clip at 0);
             bonus ~ p. The paper (App. B) claims the output follows p. It does not: the mass
             p - min(q, p_hat) can be negative and clipping changes the law (DESIGN errata 1).
             `output_law` gives the law it actually has.
Verification under p_hat is the rule `tandem.sampling.acceptance.Augmented` (its mode and
tail rule as here) given to the one rejection sampler.
- *temperature 0*: p and p_hat are the one-hot argmax of z (the T -> 0 limit of Eq. 6, as
  eta (q - p) is bounded), so both modes reduce to greedy decoding of the target.
"""

from __future__ import annotations

import torch

from tandem.errors import TandemError
from tandem.sampling import speculative
from tandem.sampling.warp import greedy_probs, normalize, warp

MODES = ("paper", "exact")
TAIL_RULES = ("paper", "code", "none")


def augmented_target(
    target_logits: torch.Tensor,  # [..., vocab]
    draft_probs: torch.Tensor,  # [..., vocab]
    eta: float,
    temperature: float,
    *,
    tail: str = "paper",
    tail_ratio: float = 0.1,
) -> torch.Tensor:  # [..., vocab]
    """The retrieval-augmented target p_hat (Eq. 6 with the tail rule `tail`, Eq. 9)."""
    assert target_logits.shape == draft_probs.shape, (target_logits.shape, draft_probs.shape)
    if tail not in TAIL_RULES:
        raise TandemError(f"unknown RAPID tail rule {tail!r}; choose one of {TAIL_RULES}")
    if temperature == 0:
        return greedy_probs(target_logits)
    dtype = draft_probs.dtype
    scaled = target_logits.to(dtype) / temperature  # [..., vocab], may hold -inf
    target_probs = torch.softmax(scaled, dim=-1)
    shift = eta * (draft_probs - target_probs)  # [..., vocab]
    if tail == "code":
        head = draft_probs >= tail_ratio * draft_probs.amax(dim=-1, keepdim=True)
        return torch.softmax(scaled + torch.where(head, shift, 0.0), dim=-1)
    shifted = torch.softmax(scaled + shift, dim=-1)
    if tail == "none":
        return shifted
    in_tail = shifted < tail_ratio * shifted.amax(dim=-1, keepdim=True)
    kept = torch.where(in_tail, target_probs, shifted)
    return kept / kept.sum(dim=-1, keepdim=True)


def augmented_from_probs(
    target_probs: torch.Tensor,  # [..., vocab] the target's warped law (zeros allowed)
    draft_probs: torch.Tensor,  # [..., vocab]
    eta: float,
    *,
    greedy: bool = False,
    tail: str = "paper",
    tail_ratio: float = 0.1,
) -> torch.Tensor:  # [..., vocab]
    """p_hat from an already warped target law (temperature, top-k, top-p applied): Eq. 6 and
    the tail rule on log(target_probs), i.e. `augmented_target` at temperature 1. Tokens the
    warp removed stay at 0. `greedy`: the one-hot argmax of that p_hat ("augmented greedy":
    RAPID's own T -> 0 limit is the target's argmax, where eta has no effect; this keeps the
    transfer and is deterministic)."""
    assert target_probs.shape == draft_probs.shape, (target_probs.shape, draft_probs.shape)
    dtype = draft_probs.dtype
    logits = torch.log(target_probs.to(dtype))  # [..., vocab], -inf where the warp cut
    augmented = augmented_target(logits, draft_probs, eta, 1.0, tail=tail, tail_ratio=tail_ratio)
    return greedy_probs(augmented) if greedy else augmented


def paper_residual(
    draft_probs: torch.Tensor,  # [..., vocab]
    target_probs: torch.Tensor,  # [..., vocab]
    augmented_probs: torch.Tensor,  # [..., vocab]
) -> torch.Tensor:  # [..., vocab]
    """Eq. 10 / Algorithm 1 line 26: norm(max(p - p_hat, p - q, 0)) = norm(max(0, p - min(q, p_hat))).

    Its mass is zero only if p <= min(q, p_hat) everywhere, i.e. p = q = p_hat, where a
    rejection cannot happen; p is used then.
    """
    excess = target_probs - torch.minimum(draft_probs, augmented_probs)
    return normalize(excess.clamp_min(0.0), target_probs)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise TandemError(f"unknown RAPID mode {mode!r}; choose one of {MODES}")


def output_law(
    draft_probs: torch.Tensor,  # [..., vocab]
    target_logits: torch.Tensor,  # [..., vocab]
    eta: float,
    temperature: float,
    *,
    mode: str,
    tail: str = "paper",
    tail_ratio: float = 0.1,
) -> torch.Tensor:  # [..., vocab]
    """Exact law of the token emitted at one drafted position (draft token ~ draft_probs).

    "exact" gives p_hat; "paper" gives min(q, p_hat) + (1 - beta) * paper_residual, with
    beta = sum min(q, p_hat), which equals p only where p >= min(q, p_hat) everywhere.
    """
    check_mode(mode)
    augmented = augmented_target(
        target_logits, draft_probs, eta, temperature, tail=tail, tail_ratio=tail_ratio
    )
    if mode == "exact":
        return speculative.position_law(draft_probs, augmented)
    target_probs = warp(target_logits.to(draft_probs.dtype), temperature=temperature)
    return speculative.position_law(
        draft_probs, augmented, paper_residual(draft_probs, target_probs, augmented)
    )
