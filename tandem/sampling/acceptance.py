"""Acceptance rules: the law a block of drafts is verified against.

Every verifier in tandem (the spec cloud, RAPID's target, plain decoding as the block with no
drafts) runs the one rejection sampler, `tandem.sampling.speculative.verify_batch`. What
differs between modes is only which laws it is given, and that is a *rule*:

- *target_probs*: the target's warped law at each draft position plus the bonus row,
  [n + 1, vocab] (n drafts; n = 0 is a plain decoding step).
- *draft_probs*: the law each draft was drawn from, [n, vocab], or [n + 1, vocab] when the
  drafter also sent its law at the bonus position (RAPID's exact mode uses it there).
- `Laws`: what the sampler tests against (`verify`, [n + 1, vocab]) and, when it is not the
  standard norm(max(0, verify - draft)), the law a rejected position is resampled from
  (`residual`, [n, vocab]).

Rules:
- `Standard`: the target itself. Output law: the target chain (Leviathan et al.).
- `Augmented`: RAPID's retrieval-augmented target p_hat (`tandem.sampling.rapid`: Eq. 6 and a
  tail rule) at every position with a draft law. mode "exact": output law p_hat; mode
  "paper": the paper's residual (Eq. 10), whose law `tandem.sampling.rapid.output_law` gives.
  The bonus row follows p_hat when the drafter's law there is known, else the target.
  `greedy`: the one-hot argmax of p_hat (the spec modes' "augmented greedy").

Verifiers holding raw logits call `judge_logits`, which warps them, except at temperature 0
under `Standard`, where it takes the sampler's greedy path on the logits directly.

SQS-SD's transmitted law and separate rejection are not rules: the draft rows a verifier
holds already are the transmitted (decoded) laws, and separate rejection only changes who
draws the recovered token (`tandem.protocols.spec.separate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem.sampling import speculative
from tandem.sampling.rapid import augmented_from_probs, check_mode, paper_residual
from tandem.sampling.seeds import Draws
from tandem.sampling.warp import warp


@dataclass(frozen=True)
class Laws:
    verify: torch.Tensor  # [n + 1, vocab]
    residual: torch.Tensor | None = None  # [n, vocab]; None: the standard residual


class Rule(Protocol):
    def laws(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> Laws: ...


@dataclass(frozen=True)
class Standard:
    def laws(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> Laws:
        return Laws(target_probs)


@dataclass(frozen=True, kw_only=True)
class Augmented:
    eta: float
    mode: str = "exact"
    tail: str = "paper"
    tail_ratio: float = 0.1
    greedy: bool = False

    def __post_init__(self) -> None:
        check_mode(self.mode)

    def laws(self, target_probs: torch.Tensor, draft_probs: torch.Tensor) -> Laws:
        """Works on any leading (batch) dimensions: [..., n + 1, vocab], [..., rows, vocab]."""
        n, rows = target_probs.shape[-2] - 1, draft_probs.shape[-2]
        assert rows in (n, n + 1), (target_probs.shape, draft_probs.shape)
        dtype = draft_probs.dtype
        target = target_probs.to(dtype)
        augmented = augmented_from_probs(
            target[..., :rows, :],
            draft_probs,
            self.eta,
            greedy=self.greedy,
            tail=self.tail,
            tail_ratio=self.tail_ratio,
        )  # [..., rows, vocab]
        if self.mode == "exact":
            return Laws(torch.cat([augmented, target[..., rows:, :]], dim=-2))
        residual = paper_residual(
            draft_probs[..., :n, :], target[..., :n, :], augmented[..., :n, :]
        )
        return Laws(torch.cat([augmented[..., :n, :], target[..., n:, :]], dim=-2), residual)


def judge(
    rule: Rule,
    draft_tokens: torch.Tensor,  # [n] int64
    draft_probs: torch.Tensor | None,  # [n or n + 1, vocab]; None: no drafts (n = 0)
    target_probs: torch.Tensor,  # [n + 1, vocab]
    draws: torch.Generator | Draws,
) -> tuple[speculative.Verdict, Laws]:
    """Verify one block under `rule` with the one sampler; also returns the laws it was
    tested against. With no drafts it is one decoding step (the bonus draw alone)."""
    n = draft_tokens.shape[0]
    if draft_probs is None:
        assert n == 0, "drafts need their laws"
        draft_probs = target_probs.new_zeros((0, target_probs.shape[-1]))
    laws = rule.laws(target_probs, draft_probs)
    verdict = speculative.verify(
        draft_tokens, draft_probs[:n], laws.verify, draws, residual_probs=laws.residual
    )
    return verdict, laws


def judge_logits(
    rule: Rule,
    draft_tokens: torch.Tensor,  # [n] int64
    draft_probs: torch.Tensor | None,  # [n or n + 1, vocab]; None: no drafts (n = 0)
    logits: torch.Tensor,  # [n + 1, vocab]: the target's raw rows
    draws: torch.Generator | Draws,
    *,
    sampling: dict,  # `warp`'s keyword arguments
    laws: bool = False,
) -> tuple[speculative.Verdict, Laws | None]:
    """`judge` on the target's raw logits warped by `sampling`. At temperature 0 under the
    standard rule, unless the caller needs the laws, it takes the sampler's greedy path on the
    logits themselves (`speculative.verify_greedy`: the same verdict, no one-hot rows over the
    vocabulary built, no draws taken) and returns no laws."""
    if sampling["temperature"] == 0 and type(rule) is Standard and not laws:
        return speculative.verify_greedy(draft_tokens, logits), None
    return judge(rule, draft_tokens, draft_probs, warp(logits, **sampling), draws)
