"""Block verification for speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Words used here:
- *draft tokens*: the gamma tokens a drafter proposed, each drawn from its row of
  `draft_probs`.
- *target_probs*: the verifier's law at each draft position plus one more row, the *bonus*
  position after the last draft token: gamma + 1 rows.
- *accepted*: draft token i is kept with probability min(1, target(x_i) / draft(x_i)); the block
  stops at the first rejection.
- *residual*: the law a rejected position is resampled from, norm(max(0, target - draft)).
  Its mass is zero only when target == draft on that row, where a rejection cannot happen;
  the target row is then used so that float round-off never divides by zero.
- *recovered token*: the token drawn from the residual at the first rejected position.
- *bonus token*: drawn from the bonus row when every draft token was accepted.
- *next token*: the recovered or the bonus token; a block always emits
  `num_accepted + 1` tokens.
- *greedy rows*: when every target row of a block is one-hot (temperature 0), acceptance is
  the deterministic test `draft token == argmax`, and the next token is the argmax.
  `verify_greedy` is that path on the raw logits, for a verifier that knows it decodes at
  temperature 0 under the standard rule: the same verdict, without building one-hot rows
  (at a plain decoding step that was most of the ~1 ms a token the loop cost beyond the
  engine's decode on one core).

The output law is exactly the target chain (`docs/exactness.md`, `tests/exactness/`).
`verify_batch` is the one rejection sampler every mode verifies with; `verify` is its
one-block view. Its randomness comes from `draws` (`tandem.sampling.seeds`): the modes pass
`PositionDraws` (one generator per output position); a bare `torch.Generator` is consumed
in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.sampling.seeds import Draws, as_draws
from tandem.sampling.warp import is_one_hot, normalize


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one block of draft tokens."""

    num_accepted: int
    next_token: int
    is_bonus: bool
    accepted_tokens: tuple[int, ...]

    @property
    def tokens(self) -> tuple[int, ...]:
        """Every token the block emits: the accepted drafts then the next token."""
        return (*self.accepted_tokens, self.next_token)


@dataclass(frozen=True)
class BatchVerdict:
    """Outcomes of verifying a batch of independent blocks (tensors, one entry per block)."""

    draft_tokens: torch.Tensor  # [batch, gamma] int64
    num_accepted: torch.Tensor  # [batch] int64
    next_token: torch.Tensor  # [batch] int64
    is_bonus: torch.Tensor  # [batch] bool

    def row(self, index: int) -> Verdict:
        num_accepted = int(self.num_accepted[index])
        return Verdict(
            num_accepted=num_accepted,
            next_token=int(self.next_token[index]),
            is_bonus=bool(self.is_bonus[index]),
            accepted_tokens=tuple(int(t) for t in self.draft_tokens[index, :num_accepted]),
        )


def acceptance_probs(
    draft_tokens: torch.Tensor,  # [..., gamma] int64
    draft_probs: torch.Tensor,  # [..., gamma, vocab]
    target_probs: torch.Tensor,  # [..., gamma(+1), vocab]
) -> torch.Tensor:  # [..., gamma]
    """Exact probability that each draft token passes its own test, min(1, target/draft).

    A draft token the drafter gave probability 0 is accepted iff the target allows it.
    """
    gamma = draft_tokens.shape[-1]
    index = draft_tokens.unsqueeze(-1)  # [..., gamma, 1]
    draft_at = draft_probs.gather(-1, index).squeeze(-1)  # [..., gamma]
    target_at = target_probs[..., :gamma, :].gather(-1, index).squeeze(-1)  # [..., gamma]
    ratio = target_at / draft_at.clamp_min(torch.finfo(draft_at.dtype).tiny)
    return torch.where(draft_at > 0, ratio.clamp(max=1.0), (target_at > 0).to(ratio.dtype))


def residual(
    draft_probs: torch.Tensor,  # [..., vocab]
    target_probs: torch.Tensor,  # [..., vocab]
) -> torch.Tensor:  # [..., vocab]
    """norm(max(0, target - draft)); the target row where that has no mass."""
    return normalize((target_probs - draft_probs).clamp_min(0.0), target_probs)


def position_law(
    draft_probs: torch.Tensor,  # [..., vocab]
    target_probs: torch.Tensor,  # [..., vocab]
    residual_probs: torch.Tensor | None = None,  # [..., vocab]
) -> torch.Tensor:  # [..., vocab]
    """Exact law of the token emitted at one position when its draft token ~ `draft_probs`.

    Accept-and-keep mass is min(draft, target); the rest, 1 - sum(min), is spread by the
    residual law (the standard one unless another is given, as RAPID's paper mode does).
    Equals `target_probs` for the standard residual.
    """
    if residual_probs is None:
        residual_probs = residual(draft_probs, target_probs)
    kept = torch.minimum(draft_probs, target_probs)
    rejected = (1.0 - kept.sum(dim=-1, keepdim=True)).clamp_min(0.0)
    return kept + rejected * residual_probs


def verify_batch(
    draft_tokens: torch.Tensor,  # [batch, gamma] int64
    draft_probs: torch.Tensor,  # [batch, gamma, vocab]
    target_probs: torch.Tensor,  # [batch, gamma + 1, vocab]
    draws: torch.Generator | Draws,
    *,
    residual_probs: torch.Tensor | None = None,  # [batch, gamma, vocab]
) -> BatchVerdict:
    """Verify a batch of independent draft blocks at once.

    `residual_probs` replaces the standard residual law (RAPID's paper mode uses this);
    leave it None for exact speculative sampling.
    """
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[-1]
    assert draft_probs.shape == (batch, gamma, vocab), (draft_probs.shape, draft_tokens.shape)
    assert target_probs.shape == (batch, gamma + 1, vocab), (target_probs.shape, gamma)
    assert draft_tokens.dtype == torch.int64, draft_tokens.dtype
    if residual_probs is None:
        residual_probs = residual(draft_probs, target_probs[:, :gamma])
    assert residual_probs.shape == (batch, gamma, vocab), residual_probs.shape

    # Stochastic path: u * draft(x) < target(x) has probability min(1, target(x) / draft(x)).
    draws = as_draws(draws)
    uniforms = draws.uniforms(batch, gamma, target_probs.dtype)
    index = draft_tokens.unsqueeze(-1)  # [batch, gamma, 1]
    draft_at = draft_probs.gather(-1, index).squeeze(-1)  # [batch, gamma]
    target_at = target_probs[:, :gamma].gather(-1, index).squeeze(-1)  # [batch, gamma]
    passed = uniforms * draft_at < target_at  # [batch, gamma]

    # Greedy path: all target rows one-hot -> accept iff the draft token is the argmax.
    greedy = is_one_hot(target_probs).all(dim=-1)  # [batch]
    argmax = target_probs.argmax(dim=-1)  # [batch, gamma + 1]
    passed = torch.where(greedy.unsqueeze(-1), draft_tokens == argmax[:, :gamma], passed)

    num_accepted = passed.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # [batch]
    is_bonus = num_accepted == gamma
    next_token = argmax.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)  # [batch] greedy
    if not bool(greedy.all()):  # (a draw from a one-hot row could only give its argmax)
        # Row the next token comes from: the residual at the first rejection, or the bonus row.
        final_rows = torch.cat([residual_probs, target_probs[:, gamma:]], dim=1)  # [b, g+1, V]
        final_probs = final_rows[torch.arange(batch), num_accepted]  # [batch, vocab]
        sampled = draws.next_tokens(final_probs, num_accepted)  # [batch]
        next_token = torch.where(greedy, next_token, sampled)
    return BatchVerdict(
        draft_tokens=draft_tokens,
        num_accepted=num_accepted,
        next_token=next_token,
        is_bonus=is_bonus,
    )


def verify_greedy(
    draft_tokens: torch.Tensor,  # [gamma] int64
    logits: torch.Tensor,  # [gamma + 1, vocab]: the target's rows, bonus row last
) -> Verdict:
    """`verify` of one block against the greedy (one-hot) rows at the argmax of `logits`, as
    `warp(logits, temperature=0)` makes them: draft i passes iff it is its row's argmax (ties:
    the lowest id, as `torch.argmax`), the next token is the argmax after the last pass. No
    randomness is involved, so no draws are taken."""
    assert draft_tokens.dim() == 1 and draft_tokens.dtype == torch.int64, draft_tokens
    gamma = draft_tokens.shape[0]
    assert logits.dim() == 2 and logits.shape[0] == gamma + 1, (logits.shape, gamma)
    argmax = logits.argmax(dim=-1).tolist()  # [gamma + 1]
    drafts = draft_tokens.tolist()
    num_accepted = next((i for i in range(gamma) if drafts[i] != argmax[i]), gamma)
    return Verdict(
        num_accepted=num_accepted,
        next_token=argmax[num_accepted],
        is_bonus=num_accepted == gamma,
        accepted_tokens=tuple(drafts[:num_accepted]),
    )


def verify(
    draft_tokens: torch.Tensor,  # [gamma] int64
    draft_probs: torch.Tensor,  # [gamma, vocab]
    target_probs: torch.Tensor,  # [gamma + 1, vocab]
    draws: torch.Generator | Draws,
    *,
    residual_probs: torch.Tensor | None = None,  # [gamma, vocab]
) -> Verdict:
    """Verify one block of draft tokens against the target's rows (bonus row last)."""
    assert draft_tokens.dim() == 1, draft_tokens.shape
    verdicts = verify_batch(
        draft_tokens.unsqueeze(0),
        draft_probs.unsqueeze(0),
        target_probs.unsqueeze(0),
        draws,
        residual_probs=None if residual_probs is None else residual_probs.unsqueeze(0),
    )
    return verdicts.row(0)
