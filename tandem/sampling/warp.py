"""Logit warping and sampling: logits -> probabilities -> tokens.

Words used here:
- *logits*: unnormalised scores over the vocabulary, `[..., vocab]`.
- *warp*: temperature, then top-k, then top-p (the order transformers uses), then softmax.
- *greedy*: temperature 0. The "distribution" is the one-hot vector of the argmax (the first
  maximal index on ties), so every kernel downstream can treat greedy as a degenerate law.
- *one-hot row*: a probability row whose largest entry is exactly 1.0. Kernels take their
  deterministic greedy path on such rows.

All functions are pure, work on any number of leading dimensions and keep the input dtype
(float32 or float64). Randomness comes only from the `torch.Generator` passed in.
"""

from __future__ import annotations

import numpy as np
import torch

from tandem.errors import TandemError


def greedy_probs(logits: torch.Tensor) -> torch.Tensor:
    """One-hot rows at the argmax of `logits`. [..., vocab] -> [..., vocab]"""
    index = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
    out = torch.zeros_like(logits, dtype=_float_dtype(logits))
    return out.scatter_(-1, index, 1.0)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf (ties with the k-th are kept)."""
    if k < 1:
        raise TandemError(f"top_k must be >= 1, got {k}")
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [..., 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`.

    The most likely token is always kept, so the result is never empty.
    """
    if not 0.0 < top_p <= 1.0:
        raise TandemError(f"top_p must be in (0, 1], got {top_p}")
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [..., vocab]
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [..., vocab]
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def warp(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Warped next-token probabilities. [..., vocab] logits -> [..., vocab] probs.

    temperature 0 gives one-hot rows at the argmax (top-k/top-p cannot change the argmax).
    """
    if temperature < 0:
        raise TandemError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return greedy_probs(logits)
    scaled = logits.to(_float_dtype(logits)) / temperature
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    return torch.softmax(scaled, dim=-1)


def is_one_hot(probs: torch.Tensor) -> torch.Tensor:
    """Whether each row is a greedy (one-hot) law. [..., vocab] -> bool [...]"""
    return probs.amax(dim=-1) == 1.0


def normalize(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """`weights / weights.sum()` row by row; rows with no mass take `fallback` instead.

    weights, fallback: [..., vocab] non-negative. Used for residual laws, whose mass is zero
    exactly when a rejection cannot happen, so the fallback never changes an output law.
    """
    mass = weights.sum(dim=-1, keepdim=True)  # [..., 1]
    empty = mass <= 0
    safe = torch.where(empty, fallback, weights)
    return safe / torch.where(empty, fallback.sum(dim=-1, keepdim=True), mass)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Draw one token per row. [..., vocab] probs -> int64 [...]

    Rows need not be exactly normalised; zero-probability tokens are never drawn.
    """
    flat = probs.reshape(-1, probs.shape[-1])  # [rows, vocab]
    tokens = torch.multinomial(flat, 1, generator=generator)  # [rows, 1]
    return tokens.reshape(probs.shape[:-1])


def support_argmax(probs: torch.Tensor, support: torch.Tensor | None = None) -> int:
    """`probs.argmax()` of a [vocab] row (ties: the lowest id). With `support` ([n] int64 ids,
    any order, repeats allowed) outside which `probs` is 0, only those ids are read: the same
    id, without a pass over the vocabulary."""
    if support is None:
        return int(probs.argmax())
    if support.shape[0] == 1:  # one id (most sparse greedy drafts): the one candidate
        return int(support[0])
    if probs.device.type != "cpu" or probs.dtype not in (torch.float32, torch.float64):
        ids = torch.unique(support)  # ascending, so a tie goes to the lowest id as above
        return int(ids[probs[ids].argmax()])
    ids = unique_ids(support)  # ascending; np.argmax takes the first of a tie, too
    return int(ids[int(np.argmax(probs.numpy()[ids]))])


def kept_argmax(ids: np.ndarray, values: np.ndarray) -> int:
    """`support_argmax` of the law that is `values` ([n] > 0 somewhere) at the distinct `ids`
    ([n] int64, any order) and 0 elsewhere: the id of the largest value, ties: the lowest."""
    if ids.shape[0] == 1:
        return int(ids[0])
    top = values.max()
    return int(ids[values == top].min())


SET_SORTED_IDS = 256  # up to this many ids, `unique_ids` sorts a Python set


def unique_ids(support: torch.Tensor) -> np.ndarray:
    """[n] int64 ids (CPU, any order, repeats allowed) -> their distinct values, ascending:
    `np.unique`. A sparse draft's support holds a few ids, where `np.unique`'s many small numpy
    calls cost more than the sort itself (tens of microseconds a call once a decode step has
    evicted them from the caches); a Python set gives the same array with two calls."""
    if support.shape[0] <= SET_SORTED_IDS:
        return np.array(sorted(set(support.tolist())), dtype=np.int64)
    return np.unique(support.numpy())


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row r's token whose cumulative-mass interval holds u[r] * its total, in float64.

    probs: [rows, vocab] non-negative, need not be normalized; u: [rows] in [0, 1).
    P(token j) = probs[r, j] / total up to float64 round-off. A token of mass 0 owns an empty
    interval; only a round-off can return one, and callers check (see `sample_rows`)."""
    cdf = probs.double().cumsum(dim=-1)  # [rows, vocab]
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)  # [rows, 1]
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_max(probs.shape[-1] - 1)


def sample_rows(probs: torch.Tensor, u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` ([rows, vocab]) from the given uniforms `u` ([rows]):
    `inverse_cdf`, with `torch.multinomial` (on `generator`) for a row whose round-off lands
    on a token of mass 0. Each row costs one uniform the caller drew, whatever it holds; over
    a 152K vocabulary about a tenth of `torch.multinomial`'s time on one core."""
    tokens = inverse_cdf(probs, u)
    missed = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) <= 0
    if bool(missed.any()):
        tokens = torch.where(missed, sample(probs, generator), tokens)
    return tokens


BLOCK = 256  # tokens per block of `sample_one`'s two-level search


def sample_one(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from `probs` ([vocab], non-negative, need not be normalized): every single
    draw in tandem (drafts, recovered and bonus tokens, plain decoding) comes from here.

    Inverse CDF in two levels, in float64: one uniform u in [0, total), the block of `BLOCK`
    tokens whose cumulative mass passes u, then the token inside it. P(token) = its mass /
    total up to float64 round-off; a token of mass 0 owns an empty interval and is never
    drawn (a round-off that lands on one falls back to `torch.multinomial`). About 0.15 ms
    over a 152K vocabulary on one core, where `torch.multinomial` takes 3.5 ms (it draws an
    exponential per token). A row with a single nonzero entry (a greedy law) returns it
    without drawing, so the generator is not advanced; every mode draws from a fresh
    generator per position (`tandem.sampling.seeds`), where that cannot matter."""
    assert probs.dim() == 1, probs.shape
    if int(torch.count_nonzero(probs)) == 1:
        return int(probs.argmax())
    vocab = probs.shape[0]
    full = vocab - vocab % BLOCK
    sums = probs[:full].view(-1, BLOCK).sum(dim=1, dtype=torch.float64)  # [blocks]
    if full < vocab:
        sums = torch.cat([sums, probs[full:].sum(dtype=torch.float64).view(1)])
    ends = sums.cumsum(0)  # [blocks] cumulative mass at each block's end
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * float(ends[-1])
    block = min(int(torch.searchsorted(ends, u, right=True)), ends.shape[0] - 1)
    start = block * BLOCK
    inside = probs[start : start + BLOCK].double().cumsum(0)
    before = float(ends[block - 1]) if block else 0.0
    index = min(int(torch.searchsorted(inside, u - before, right=True)), inside.shape[0] - 1)
    token = start + index
    if float(probs[token]) > 0:
        return token
    return int(torch.multinomial(probs.float(), 1, generator=generator))


def _float_dtype(tensor: torch.Tensor) -> torch.dtype:
    return tensor.dtype if tensor.is_floating_point() else torch.float32
