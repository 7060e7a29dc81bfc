"""Draft tokens and the draft queues both sides keep (paper Sec. 3, steps 2-4).

Words used here:
- *draft*: one token a side proposes for `position`, sampled from its *sent probs* (the law
  its codec transmits, DESIGN errata 2), with the payload the peer decodes into the same
  sent probs, the side's logweight, and how long producing it took (for the profiler).
- *epoch*: how many of this side's drafts have been rejected so far. Both sides count the
  same rejections (every target token reaches both), so a draft made before its side learnt
  of a rejection carries an old epoch and is dropped wherever it arrives.
- *branch draft*: a draft for position t + 1 made on the side's own chain up to t - 1 plus
  the peer's (different) draft token x at t, before anyone knows the target at t
  (`branch_of` = (t, x)). It counts as the side's first draft of its next epoch if, and only
  if, that epoch starts with a rejection at t whose target token is x (`machine.SideMachine`).
- *draft queue*: the unresolved drafts of one side, in position order. Each side keeps one
  queue per side (its own and the peer's, which the peer broadcasts), so the aggregator can
  move to either side at any time. Resolving position t pops the front draft if it equals the
  target token (accepted) and clears the queue otherwise (rejected).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from tandem.codecs import Codec
from tandem.codecs import draft as codec_draft
from tandem.codecs.sparse import SparseCodec, sent_array
from tandem.protocols.dragon.decoder import SideLaw
from tandem.sampling.seeds import position_generator
from tandem.sampling.warp import kept_argmax, support_argmax


@dataclass(frozen=True)
class Draft:
    side: str
    position: int
    epoch: int
    token: int
    # [vocab] float32, what both sides hold for this draft; None for a draft in the kept form
    # (`values` at `support`), whose [vocab] array `sent_probs` builds when first read
    dense: torch.Tensor | None
    logweight: float
    payload: bytes  # the codec's encoding of the law
    decode_s: float = 0.0  # time to produce this draft (decode + law + codec)
    context: int = 0  # the side's context length when it decoded for this draft
    created: float = field(default_factory=time.perf_counter)
    branch_of: tuple[int, int] | None = None  # (t, x): a branch draft (module docstring)
    # [n] int64 ids outside which the sent probs are 0, when the codec keeps them (sparse
    # codecs): greedy aggregation then reads those ids only (`greedy_aggregate_kept`)
    support: torch.Tensor | None = None
    # [n] float32 sent probs at `support` (the kept form), or None; `vocab_size` with them
    values: np.ndarray | None = None
    vocab_size: int = 0

    @property
    def sent_probs(self) -> torch.Tensor:
        """[vocab] float32 sent probs (from the kept form, the first time it is read; None
        for a draft without a law: the scheduling simulator's)."""
        if self.dense is None and self.values is not None:
            ids = self.support.numpy()
            dense = torch.from_numpy(sent_array(self.vocab_size, ids, self.values))
            object.__setattr__(self, "dense", dense)  # a cache: the same numbers every time
        return self.dense


def make_draft(
    law: SideLaw,
    *,
    codec: Codec,
    side: str,
    position: int,
    epoch: int,
    seed: int,
    greedy: bool,
    decode_s: float = 0.0,
    context: int = 0,
) -> Draft:
    """Encode the side law and draw the draft from what is transmitted (QS principle).

    Greedy drafts are the argmax of the sent probs; sampled drafts use the position seed of
    (seed, side, position), so a redraft after a rollback is as fresh as the first one.
    """
    common = dict(side=side, position=position, epoch=epoch, logweight=law.logweight)
    common.update(decode_s=decode_s, context=context)
    if greedy:
        kept = _kept_form(law, codec)
        if kept is not None:  # a sparse codec: the kept form, no [vocab] array
            payload, ids, values = kept
            return Draft(
                token=kept_argmax(ids, values),
                dense=None,
                payload=payload,
                support=torch.from_numpy(ids),
                values=values,
                vocab_size=law.probs.shape[-1],
                **common,
            )
        payload, sent_probs, _ = codec.encode_sent(law.probs)  # no support: not a sparse codec
        codec.observe(law.probs)
        return Draft(token=support_argmax(sent_probs), dense=sent_probs, payload=payload, **common)
    out = codec_draft(codec, law.probs, position_generator(seed, side, position))
    return Draft(token=out.token, dense=out.sent_probs, payload=out.payload, **common)


def _kept_form(law: SideLaw, codec: Codec) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """A sparse codec's (payload, kept ids, sent values) of `law` (a softmax row's without
    its total where it decides them: `SparseCodec.softmax_kept`); None for other codecs.
    Sparse codecs are stateless (`observe` does nothing), so nothing else is owed to them."""
    if not isinstance(codec, SparseCodec):
        return None
    if law.softmax:
        single = codec.softmax_kept(law.probs)
        if single is not None:
            return single
    return codec.encode_kept_sent(law.probs)


class DraftQueue:
    """One side's unresolved drafts, front = lowest position."""

    def __init__(self) -> None:
        self._drafts: deque[Draft] = deque()

    def __len__(self) -> int:
        return len(self._drafts)

    def push(self, draft: Draft) -> None:
        if self._drafts and draft.position != self._drafts[-1].position + 1:
            raise ValueError(
                f"{draft.side} draft for position {draft.position} after "
                f"{self._drafts[-1].position}: drafts must arrive in order"
            )
        self._drafts.append(draft)

    def front_at(self, position: int) -> Draft | None:
        """The draft for `position`, dropping older ones; None if it has not arrived."""
        while self._drafts and self._drafts[0].position < position:
            self._drafts.popleft()
        if self._drafts and self._drafts[0].position == position:
            return self._drafts[0]
        return None

    def at(self, position: int) -> Draft | None:
        """The queued draft for `position`, if any (nothing is dropped)."""
        if not self._drafts:
            return None
        index = position - self._drafts[0].position
        return self._drafts[index] if 0 <= index < len(self._drafts) else None

    def pop(self) -> Draft:
        return self._drafts.popleft()

    def clear(self) -> int:
        dropped = len(self._drafts)
        self._drafts.clear()
        return dropped
