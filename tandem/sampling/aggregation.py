"""DRAGON's output aggregation and Speculative Aggregation (paper Sec. 4, Algorithm 1).

Words used here:
- *side*: `local` is the side that runs the aggregator, `remote` the peer. Each side holds a
  *locally aggregated* law over the vocabulary, `local_probs` / `remote_probs`, the
  relevance-weighted mixture of its per-document laws (`document_mixture`).
- *logweight* h_s: logsumexp of the side's document relevance scores (`side_logweight`); the
  side weights are eta = softmax([h_l, h_r]) (`side_weights`).
- *aggregate law*: eta_l * local_probs + eta_r * remote_probs (`mixture`), the law VDRAG
  samples token by token.
- *draft token*: each side samples its own draft from its own law, without waiting.
- *Sample(x, own, other, eta_other)*: keep the draft x, unless own(x) > other(x), in which case
  it is replaced, with probability eta_other * (1 - other(x) / own(x)), by a draw from
  norm(max(0, other - own)). The kept token follows the aggregate law exactly.
- *accepted*: after Sample runs on both drafts and a fair coin picks one result as the target
  token, a draft is accepted iff it equals the target token.

The target token's law is exactly the aggregate law given independent drafts, each drawn
from the law the aggregator holds for its side (`docs/exactness.md`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from tandem.sampling.warp import normalize, sample_rows, unique_ids


@dataclass(frozen=True)
class AggregateBatch:
    """Outcomes of a batch of independent aggregation steps."""

    token: torch.Tensor  # [batch] int64, the target token
    local_accepted: torch.Tensor  # [batch] bool
    remote_accepted: torch.Tensor  # [batch] bool


def side_logweight(scores: torch.Tensor) -> torch.Tensor:
    """h = logsumexp of a side's relevance scores. [docs] -> scalar (-inf with no docs)."""
    assert scores.dim() == 1, scores.shape
    return torch.logsumexp(scores, dim=0)


def side_weights(
    local_logweight: torch.Tensor | float, remote_logweight: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(eta_l, eta_r) = softmax([h_l, h_r]); works on scalars or matching [batch] tensors."""
    local_logweight = torch.as_tensor(local_logweight, dtype=torch.float64)
    remote_logweight = torch.as_tensor(remote_logweight, dtype=torch.float64)
    both = torch.stack(torch.broadcast_tensors(local_logweight, remote_logweight), dim=-1)
    assert bool(torch.isfinite(both.amax(dim=-1)).all()), "both sides have zero weight"
    weights = torch.softmax(both, dim=-1)  # [..., 2]
    return weights[..., 0], weights[..., 1]


def document_mixture(
    doc_probs: torch.Tensor,  # [docs, vocab]
    scores: torch.Tensor,  # [docs]
) -> torch.Tensor:  # [vocab]
    """A side's locally aggregated law: sum_d softmax(scores)(d) * doc_probs[d]."""
    assert doc_probs.dim() == 2 and scores.shape == doc_probs.shape[:1], (
        doc_probs.shape,
        scores.shape,
    )
    weights = torch.softmax(scores.to(doc_probs.dtype), dim=0)  # [docs]
    return weights @ doc_probs


def mixture(
    local_probs: torch.Tensor,  # [..., vocab]
    remote_probs: torch.Tensor,  # [..., vocab]
    local_logweight: torch.Tensor | float,  # [...] or scalar
    remote_logweight: torch.Tensor | float,  # [...] or scalar
) -> torch.Tensor:  # [..., vocab]
    """The aggregate law eta_l * local_probs + eta_r * remote_probs."""
    eta_l, eta_r = side_weights(local_logweight, remote_logweight)
    eta_l = eta_l.to(local_probs.dtype).unsqueeze(-1)
    eta_r = eta_r.to(local_probs.dtype).unsqueeze(-1)
    return eta_l * local_probs + eta_r * remote_probs


def greedy_aggregate(
    local_probs: torch.Tensor,  # [vocab]
    remote_probs: torch.Tensor,  # [vocab]
    local_logweight: torch.Tensor | float,
    remote_logweight: torch.Tensor | float,
    support: torch.Tensor | None = None,  # [n] int64: ids outside which both laws are 0
) -> int:
    """The greedy target token: argmax of the aggregate law (ties: the lowest id), what
    `speculative_aggregate(..., greedy=True)` returns. With `support` the mixture is formed on
    those ids only (the same float32 operations per id, so the same token): two sparse drafts
    of a 152K vocabulary then cost a few dozen multiplications instead of three passes."""
    if support is None:
        return int(mixture(local_probs, remote_probs, local_logweight, remote_logweight).argmax())
    on_cpu = local_probs.device.type == "cpu" and remote_probs.device.type == "cpu"
    if not on_cpu or local_probs.dtype != torch.float32 or remote_probs.dtype != torch.float32:
        ids = torch.unique(support)  # ascending: ties go to the lowest id, as in the dense argmax
        target = mixture(local_probs[ids], remote_probs[ids], local_logweight, remote_logweight)
        return int(ids[target.argmax()])
    # the same float32 products and sum per id as `mixture`, in numpy: a few dozen numbers
    eta_l, eta_r = _float32_weights(float(local_logweight), float(remote_logweight))
    ids = unique_ids(support)  # ascending: ties go to the lowest id (np.argmax: first)
    target = eta_l * local_probs.numpy()[ids] + eta_r * remote_probs.numpy()[ids]
    return int(ids[int(np.argmax(target))])


def greedy_aggregate_kept(
    local: tuple[np.ndarray, np.ndarray],  # ([n] int64 distinct ids, [n] float32 values)
    remote: tuple[np.ndarray, np.ndarray],
    local_logweight: float,
    remote_logweight: float,
) -> int:
    """`greedy_aggregate` of two laws in the kept form (each its values at its ids, 0
    elsewhere), without [vocab] arrays: the same float32 products and sum per id of the union
    (an id one law lacks contributes 0 x its weight, as the dense form's 0 entry does), so the
    same token; ties: the lowest id."""
    eta_l, eta_r = _float32_weights(float(local_logweight), float(remote_logweight))
    held_l = dict(zip(local[0].tolist(), local[1].tolist(), strict=True))  # float32 -> float: exact
    held_r = dict(zip(remote[0].tolist(), remote[1].tolist(), strict=True))
    ids = sorted(held_l.keys() | held_r.keys())  # ascending: np.argmax takes the first of a tie
    values_l = np.array([held_l.get(i, 0.0) for i in ids], dtype=np.float32)
    values_r = np.array([held_r.get(i, 0.0) for i in ids], dtype=np.float32)
    return ids[int(np.argmax(eta_l * values_l + eta_r * values_r))]


@functools.lru_cache(maxsize=256)
def _float32_weights(local_logweight: float, remote_logweight: float) -> tuple[np.float32, ...]:
    """`side_weights` as `mixture` applies them to float32 laws (a side's logweight rarely
    changes within an answer, so this is computed once per pair)."""
    eta_l, eta_r = side_weights(local_logweight, remote_logweight)
    return np.float32(eta_l.to(torch.float32).item()), np.float32(eta_r.to(torch.float32).item())


def resample_transition(
    own_probs: torch.Tensor,  # [vocab]
    other_probs: torch.Tensor,  # [vocab]
    other_weight: torch.Tensor | float,
) -> torch.Tensor:  # [vocab, vocab]
    """Exact kernel of Sample(x, own, other, eta_other): entry [x, y] = P(result y | draft x)."""
    other_weight = torch.as_tensor(other_weight, dtype=own_probs.dtype)
    excess = (own_probs - other_probs).clamp_min(0.0)  # [vocab]
    safe_own = own_probs.clamp_min(torch.finfo(own_probs.dtype).tiny)
    replace = torch.where(excess > 0, other_weight * excess / safe_own, 0.0)  # [vocab]
    replacement = normalize((other_probs - own_probs).clamp_min(0.0), other_probs)  # [vocab]
    keep = torch.diag(1.0 - replace)
    return keep + replace.unsqueeze(-1) * replacement.unsqueeze(0)


def acceptance_rates(
    local_probs: torch.Tensor,  # [vocab]
    remote_probs: torch.Tensor,  # [vocab]
    local_logweight: torch.Tensor | float,
    remote_logweight: torch.Tensor | float,
) -> tuple[float, float]:
    """Expected acceptance rates (alpha_l, alpha_r) of Algorithm 1, paper Eq. (5), coin 1/2.

    alpha_l = 1/2 (1 - eta_r * delta) + 1/2 sum_x local(x) target(x), delta the total
    variation between the sides (symmetric for alpha_r). The scheduler uses these.
    """
    eta_l, eta_r = side_weights(local_logweight, remote_logweight)
    target = mixture(local_probs, remote_probs, local_logweight, remote_logweight)
    delta = float(1.0 - torch.minimum(local_probs, remote_probs).sum())
    alpha_l = 0.5 * (1.0 - float(eta_r) * delta) + 0.5 * float((local_probs * target).sum())
    alpha_r = 0.5 * (1.0 - float(eta_l) * delta) + 0.5 * float((remote_probs * target).sum())
    return alpha_l, alpha_r


def _resample(
    draft_tokens: torch.Tensor,  # [batch] int64
    own_probs: torch.Tensor,  # [batch, vocab]
    other_probs: torch.Tensor,  # [batch, vocab]
    other_weight: torch.Tensor,  # [batch]
    generator: torch.Generator,
) -> torch.Tensor:  # [batch]
    """Algorithm 1's Sample(x, own, other, eta_other), batched.

    Two uniforms per row, always drawn: the test, then the replacement's inverse-CDF draw,
    which is computed only for the rows that are replaced (DRAGON aggregates one row over a
    152K vocabulary per token: `torch.multinomial` there cost 3.5 ms a side)."""
    shape = draft_tokens.shape
    uniforms = torch.rand(
        shape, generator=generator, dtype=own_probs.dtype, device=own_probs.device
    )
    picks = torch.rand(shape, generator=generator, dtype=torch.float64, device=own_probs.device)
    own_at = own_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [batch]
    other_at = other_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [batch]
    # u < eta (1 - other/own)  <=>  u * own < eta * (own - other), for own > other >= 0.
    replace = (own_at > other_at) & (uniforms * own_at < other_weight * (own_at - other_at))
    rows = replace.nonzero().squeeze(-1)  # [replaced]
    if rows.numel() == 0:
        return draft_tokens
    own, other = own_probs[rows], other_probs[rows]
    replacement = normalize((other - own).clamp_min(0.0), other)  # [replaced, vocab]
    drawn = draft_tokens.clone()
    drawn[rows] = sample_rows(replacement, picks[rows], generator)
    return drawn


def speculative_aggregate_batch(
    local_tokens: torch.Tensor,  # [batch] int64
    local_probs: torch.Tensor,  # [batch, vocab]
    remote_tokens: torch.Tensor,  # [batch] int64
    remote_probs: torch.Tensor,  # [batch, vocab]
    local_logweight: torch.Tensor | float,  # [batch] or scalar
    remote_logweight: torch.Tensor | float,  # [batch] or scalar
    generator: torch.Generator,
    *,
    greedy: bool = False,
) -> AggregateBatch:
    """Algorithm 1 on a batch of independent steps (see `speculative_aggregate`)."""
    batch, vocab = local_probs.shape
    assert remote_probs.shape == (batch, vocab), (remote_probs.shape, local_probs.shape)
    assert local_tokens.shape == (batch,) and remote_tokens.shape == (batch,)
    assert local_tokens.dtype == torch.int64 and remote_tokens.dtype == torch.int64
    if greedy:
        target = mixture(local_probs, remote_probs, local_logweight, remote_logweight)
        token = target.argmax(dim=-1)  # [batch]
    else:
        eta_l, eta_r = side_weights(local_logweight, remote_logweight)
        eta_l = eta_l.to(local_probs.dtype).expand(batch)
        eta_r = eta_r.to(local_probs.dtype).expand(batch)
        local_result = _resample(local_tokens, local_probs, remote_probs, eta_r, generator)
        remote_result = _resample(remote_tokens, remote_probs, local_probs, eta_l, generator)
        coin = torch.rand(batch, generator=generator, device=local_probs.device)
        token = torch.where(coin < 0.5, local_result, remote_result)  # exactly 1/2 each
    return AggregateBatch(
        token=token,
        local_accepted=local_tokens == token,
        remote_accepted=remote_tokens == token,
    )


def speculative_aggregate(
    local_token: int,
    local_probs: torch.Tensor,  # [vocab]
    remote_token: int,
    remote_probs: torch.Tensor,  # [vocab]
    local_logweight: torch.Tensor | float,
    remote_logweight: torch.Tensor | float,
    generator: torch.Generator,
    *,
    greedy: bool = False,
) -> tuple[int, bool, bool]:
    """One step of Speculative Aggregation: (target token, local accepted, remote accepted).

    `local_token` ~ `local_probs` and `remote_token` ~ `remote_probs`, drawn independently.
    With `greedy`, the target token is the argmax of the aggregate law (temperature 0: the
    sides should draft the argmax of their own law and send untempered laws).
    """
    assert local_probs.dim() == 1 and remote_probs.shape == local_probs.shape
    out = speculative_aggregate_batch(
        torch.tensor([local_token], device=local_probs.device),
        local_probs.unsqueeze(0),
        torch.tensor([remote_token], device=local_probs.device),
        remote_probs.unsqueeze(0),
        torch.as_tensor(local_logweight).reshape(1),
        torch.as_tensor(remote_logweight).reshape(1),
        generator,
        greedy=greedy,
    )
    return int(out.token[0]), bool(out.local_accepted[0]), bool(out.remote_accepted[0])
