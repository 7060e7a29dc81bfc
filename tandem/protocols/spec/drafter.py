"""The device side of speculative decoding as a state object (no I/O, no clocks).

Words used here:
- *committed*: output tokens the device knows are final (accepted drafts, recovered and
  bonus tokens). *drafts*: unverified tokens after them, in position order; the first `sent`
  of them are in flight. *frontier*: len(committed), the position of drafts[0].
- *epoch*: the number of rejections seen. Every rejection voids all drafts after it; requests
  carry the epoch they were drafted in, so the cloud drops stale ones.
- *fixed*: tokens the device committed that the cloud has not seen yet (the token the device
  itself resampled under separate rejection); they lead the next request.

Theory of operation: `draft_next()` (blocking: one forward pass of the draft model, preemptible
through `cancel`) drafts one token at the end of the drafts, sampled from the distribution
that goes on the wire (QS principle). `take_chunk()` hands out unsent drafts for a request;
`apply(result)` commits what the cloud accepted and rolls back the rest: the draft model's
cache is cropped to prompt + committed (the rejected draft model work is lost, nothing else).
Only one of these runs at a time; `cancel` is the only thing other threads touch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from tandem.codecs import Codec, TopKCodec, make_codec
from tandem.codecs import draft as qs_draft
from tandem.errors import TandemError
from tandem.models.base import CausalLM
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.context import LMContext
from tandem.protocols.spec.separate import device_residual
from tandem.sampling.seeds import position_generator, sample_at
from tandem.sampling.warp import sample_one, warp


@dataclass(frozen=True)
class DraftItem:
    """One drafted token and the laws behind it."""

    position: int
    token: int
    draft_probs: torch.Tensor  # [vocab] the draft model's warped law
    sent_probs: torch.Tensor  # [vocab] the law the token was sampled from (what the cloud holds)
    payload: bytes  # codec bytes (empty under separate rejection)
    draft_at: float  # sent_probs[token]
    bits: int | None  # payload information bits, when a bit budget asked for them


@dataclass(frozen=True)
class Chunk:
    """What one VerifyRequest carries."""

    epoch: int
    position: int  # position of tokens[0]
    fixed: tuple[int, ...]
    drafts: tuple[DraftItem, ...]
    final: bool  # no more drafts follow in this epoch: the cloud adds a bonus token

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.fixed + tuple(d.token for d in self.drafts)


@dataclass(frozen=True)
class Outcome:
    """The device's reading of one VerifyResult."""

    committed: tuple[int, ...]  # tokens newly committed, in order
    num_accepted: int
    rejected: bool
    bonus: bool


def make_sender_codec(config: SpecConfig) -> Codec | None:
    """The uplink codec (None under separate rejection: only draft(x) goes up)."""
    return None if config.separate else make_codec(config.codec, **config.codec_params)


class Drafter:
    """Device state for one generation. Call `prefill()` before anything else."""

    def __init__(
        self, lm: CausalLM, prompt_ids: list[int], config: SpecConfig, *, eos_id: int | None
    ) -> None:
        self.lm = lm
        self.config = config
        self.ctx = LMContext(lm, prompt_ids)
        self.codec = make_sender_codec(config)
        self.eos_id = eos_id if config.stop_at_eos else None
        self.committed: list[int] = []
        self.drafts: list[DraftItem] = []
        self.sent = 0
        self.epoch = 0
        self.fixed: list[int] = []
        self.cancel = threading.Event()
        self.lookahead = config.lookahead  # most unverified drafts held (the session adapts it)
        self._checkpoint = 0  # position of the codec's last checkpoint (C-SQS state)

    def prefill(self) -> None:
        self.ctx.prefill()

    # ---- queries ------------------------------------------------------------------------

    @property
    def frontier(self) -> int:
        return len(self.committed)

    @property
    def done(self) -> bool:
        if len(self.committed) >= self.config.max_new_tokens:
            return True
        return self.eos_id is not None and self.eos_id in self.committed

    @property
    def unsent(self) -> int:
        return len(self.drafts) - self.sent

    def exhausted(self) -> bool:
        """No more drafts in this epoch: the token budget is drafted, or EOS was."""
        if self.done or self.frontier + len(self.drafts) >= self.config.max_new_tokens:
            return True
        return bool(self.drafts) and self.drafts[-1].token == self.eos_id

    def can_draft(self) -> bool:
        """Whether another token may be drafted now (budget, EOS, lookahead)."""
        return not self.exhausted() and len(self.drafts) < self.lookahead

    def unsent_bits(self) -> int:
        return sum(d.bits or 0 for d in self.drafts[self.sent :])

    # ---- drafting -----------------------------------------------------------------------

    def draft_next(self, bits_left: int | None = None) -> DraftItem | None:
        """Draft one token (one forward pass, preemptible through `cancel`).

        With `bits_left`, returns None instead when the token's payload would not fit (the
        SQS-SD budget rule: stop drafting when the block's bits are exhausted)."""
        position = self.frontier + len(self.drafts)
        row = self.ctx.logits(cancel=self.cancel)[0]  # [vocab]
        draft = self._draw(row, position, bits_left)
        if draft is None:
            return None
        self.ctx.append([draft.token])
        self.drafts.append(draft)
        self._drafted(row, draft)
        return draft

    def _draw(self, row: torch.Tensor, position: int, bits_left: int | None) -> DraftItem | None:
        """The draft at `position` from the draft model's `row` (None: over `bits_left`)."""
        draft_probs = warp(row, **self.config.law_sampling())
        generator = position_generator(self.config.seed, "draft", position)
        bits = None
        if self.codec is None:
            token = sample_one(draft_probs, generator)
            sent_probs, payload = draft_probs, b""
        else:
            if bits_left is not None or self.config.bit_budget is not None:
                bits = self.codec.bits(draft_probs)
                if bits_left is not None and bits > bits_left:
                    return None
            item = qs_draft(self.codec, draft_probs, generator)
            token, sent_probs, payload = item.token, item.sent_probs, item.payload
            if self.config.augmented_greedy:  # the law goes up soft; the draft is its argmax
                token = int(sent_probs.argmax())
        return DraftItem(
            position=position,
            token=token,
            draft_probs=draft_probs,
            sent_probs=sent_probs,
            payload=payload,
            draft_at=float(sent_probs[token]),
            bits=bits,
        )

    def _drafted(self, row: torch.Tensor, draft: DraftItem) -> None:
        """Hook: `draft` was drafted from `row` (eager.EagerDrafter opens branches here)."""

    def take_chunk(self, max_tokens: int | None = None) -> Chunk:
        """The next unsent drafts (at most `max_tokens`) with any fixed tokens before them."""
        count = self.unsent if max_tokens is None else min(max_tokens, self.unsent)
        drafts = tuple(self.drafts[self.sent : self.sent + count])
        self.sent += count
        fixed, self.fixed = tuple(self.fixed), []
        last = self.sent == len(self.drafts) and self.exhausted()
        final = self.config.pipeline == "sync" or last
        position = self.frontier + self.sent - count - len(fixed)
        return Chunk(epoch=self.epoch, position=position, fixed=fixed, drafts=drafts, final=final)

    # ---- verdicts -----------------------------------------------------------------------

    def apply(
        self,
        *,
        epoch: int,
        position: int,
        num_accepted: int,
        next_token: int | None,
        target_payload: bytes = b"",
    ) -> Outcome:
        """Commit a verdict on the drafts starting at `position` (the frontier)."""
        if epoch != self.epoch or position != self.frontier:
            raise TandemError(
                f"spec: verdict for epoch {epoch} position {position}, "
                f"expected epoch {self.epoch} position {self.frontier}"
            )
        if not 0 <= num_accepted <= self.sent:
            raise TandemError(f"spec: {num_accepted} accepted of {self.sent} drafts in flight")
        accepted = [d.token for d in self.drafts[:num_accepted]]
        rejected_draft = self.drafts[num_accepted] if num_accepted < self.sent else None
        self.committed.extend(accepted)
        del self.drafts[:num_accepted]
        self.sent -= num_accepted
        new = list(accepted)
        rejected = bool(target_payload) or (next_token is not None and rejected_draft is not None)
        if target_payload:  # separate rejection: resample here from the top-K target
            if rejected_draft is None:
                raise TandemError("spec: a top-K target arrived without a rejected draft")
            sent_target = TopKCodec(k=self.config.downlink_k).decode(
                target_payload, self.lm.vocab_size
            )
            law = device_residual(rejected_draft.draft_probs, sent_target)
            next_token = sample_at(law, self.config.seed, "resample", rejected_draft.position)
            self.fixed.append(next_token)
        if rejected:
            self._codec_backtrack(rejected_draft)
            self.drafts.clear()
            self.sent = 0
            self.epoch += 1
        elif next_token is not None and self.codec is not None:
            self.codec.backtrack(self.frontier - self._checkpoint)  # bonus: checkpoint here
            self._checkpoint = self.frontier + 1
        if next_token is not None:
            self.committed.append(int(next_token))
            new.append(int(next_token))
        if rejected or next_token is not None:
            self.ctx.truncate(self.frontier - (1 if next_token is not None else 0))
            if next_token is not None:
                self.ctx.append([next_token])
        self._trim_to_stop()
        return Outcome(
            committed=tuple(new),
            num_accepted=num_accepted,
            rejected=rejected,
            bonus=next_token is not None and not rejected,
        )

    def _codec_backtrack(self, rejected_draft: DraftItem | None) -> None:
        """C-SQS (Algorithm 1, lines 11-13): beta returns to its value after the last accepted
        draft, then steps once on the rejected position's law."""
        if self.codec is None:
            return
        self.codec.backtrack(self.frontier - self._checkpoint)
        if rejected_draft is not None:
            self.codec.observe(rejected_draft.draft_probs)
        self._checkpoint = self.frontier

    def _trim_to_stop(self) -> None:
        limit = self.config.max_new_tokens
        if self.eos_id is not None and self.eos_id in self.committed:
            limit = min(limit, self.committed.index(self.eos_id) + 1)
        del self.committed[limit:]
