"""PicoSpec's separate rejection sampling (paper Sec. 3.3): the accept test runs in the cloud,
the resampling on the device, with a top-K target distribution on the downlink.

Words used here:
- *draft_at*: the draft probability of each draft token, the only draft information that goes
  up (float32, 4 bytes per token).
- *sent target*: the target row at a rejected position cut to its top `k` tokens, float16,
  renormalized (`tandem.codecs` "top-k": what the device decodes).
- *device residual*: norm(max(0, sent_target - draft_probs)), what the device resamples from.

The accept test is exact (it needs only draft(x) and target(x)); the resampling is not,
because the device sees only the top-K target. `position_law` gives the exact law of the
token emitted at one position under this scheme, so `law_tv` measures the error (DESIGN
errata 3): it falls to 0 once the top-K holds all of the target's mass.
"""

from __future__ import annotations

import torch

from tandem.codecs import TopKCodec
from tandem.sampling.speculative import position_law, residual


def sparse_draft_rows(
    draft_tokens: torch.Tensor,  # [n] int64
    draft_at: torch.Tensor,  # [n] float32: draft probability of each draft token
    vocab_size: int,
) -> torch.Tensor:  # [n, vocab]
    """Rows that carry only draft(x) at the draft token: all the accept test reads.

    The residual `verify` would derive from them is meaningless; the cloud never uses it."""
    rows = torch.zeros(draft_tokens.shape[0], vocab_size, dtype=torch.float32)
    return rows.scatter_(1, draft_tokens.view(-1, 1), draft_at.view(-1, 1).float())


def sent_target(target_probs: torch.Tensor, k: int) -> torch.Tensor:  # [vocab] -> [vocab]
    """The target row as the device receives it: top-k, float16, renormalized."""
    return TopKCodec(k=k).transmitted_probs(target_probs)


def device_residual(
    draft_probs: torch.Tensor,  # [vocab]: the law the rejected draft token was sampled from
    sent_target_probs: torch.Tensor,  # [vocab]: the decoded top-K target row
) -> torch.Tensor:  # [vocab]
    return residual(draft_probs, sent_target_probs)


def law(
    draft_probs: torch.Tensor,  # [..., vocab]
    target_probs: torch.Tensor,  # [..., vocab]
    k: int,
) -> torch.Tensor:  # [..., vocab]
    """Exact law of the token emitted at one position under separate rejection with top-k."""
    flat_target = target_probs.reshape(-1, target_probs.shape[-1])
    sent = torch.stack([sent_target(row, k) for row in flat_target]).reshape(target_probs.shape)
    return position_law(draft_probs, target_probs, device_residual(draft_probs, sent))


def law_tv(draft_probs: torch.Tensor, target_probs: torch.Tensor, k: int) -> torch.Tensor:
    """TV(emitted law, target law) per row: the error separate rejection makes. [...]"""
    return 0.5 * (law(draft_probs, target_probs, k) - target_probs).abs().sum(dim=-1)
