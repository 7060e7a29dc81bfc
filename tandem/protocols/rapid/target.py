"""The long-context target: scores a block of drafts in one forward pass and verifies it.

Words used here:
- *rule*: how a block is verified, given the drafts, their laws and the target's logits
  ([gamma + 1, vocab]: one row per draft position plus the bonus row):
    `RapidRule`: the retrieval-augmented target p_hat (Eq. 6 + tail rule Eq. 9), in "exact"
                 or "paper" mode (`tandem.sampling.rapid.verify`);
    `PlainRule`: naive speculative decoding against the target's own law p.
- *pending*: the last emitted token, not yet in the target's KV cache; it is fed together
  with the next block of drafts, so each round costs the target one forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem.models.base import CausalLM, State
from tandem.sampling import rapid, speculative
from tandem.sampling.speculative import Verdict
from tandem.sampling.warp import warp


class Rule(Protocol):
    def __call__(
        self,
        draft_tokens: torch.Tensor,  # [gamma] int64
        draft_probs: torch.Tensor,  # [gamma or gamma + 1, vocab]
        target_logits: torch.Tensor,  # [gamma + 1, vocab]
        generator: torch.Generator,
    ) -> Verdict: ...


@dataclass(frozen=True, kw_only=True)
class RapidRule:
    eta: float
    temperature: float
    mode: str = "exact"
    tail: str = "paper"
    tail_ratio: float = 0.1

    def __call__(self, draft_tokens, draft_probs, target_logits, generator) -> Verdict:
        return rapid.verify(
            draft_tokens,
            draft_probs,
            target_logits,
            generator,
            eta=self.eta,
            temperature=self.temperature,
            mode=self.mode,
            tail=self.tail,
            tail_ratio=self.tail_ratio,
        )


@dataclass(frozen=True, kw_only=True)
class PlainRule:
    temperature: float

    def __call__(self, draft_tokens, draft_probs, target_logits, generator) -> Verdict:
        gamma = draft_tokens.shape[0]
        target_probs = warp(target_logits.to(draft_probs.dtype), temperature=self.temperature)
        return speculative.verify(draft_tokens, draft_probs[:gamma], target_probs, generator)


class TargetVerifier:
    """A target LM holding the long-context prompt in `state` (prefilled), verifying blocks."""

    def __init__(self, lm: CausalLM, state: State, rule: Rule):
        self.lm, self.state, self.rule = lm, state, rule
        self.prompt_logits = state.logits[:1].clone()  # [1, vocab] row of the first position
        self.pending: list[int] = []

    def verify(
        self,
        draft_tokens: list[int],
        draft_probs: torch.Tensor,  # [gamma or gamma + 1, vocab]
        generator: torch.Generator,
    ) -> Verdict:
        gamma = len(draft_tokens)
        if self.pending:
            target_logits = self.lm.decode(self.state, [self.pending + draft_tokens])[0]
        else:
            block = self.lm.decode(self.state, [draft_tokens])[0]  # [gamma, vocab]
            target_logits = torch.cat([self.prompt_logits, block])
        assert target_logits.shape[0] == gamma + 1, target_logits.shape
        verdict = self.rule(
            torch.tensor(draft_tokens, dtype=torch.int64), draft_probs, target_logits, generator
        )
        self.lm.rollback(self.state, gamma - verdict.num_accepted)
        self.pending = [verdict.next_token]
        return verdict
