"""The cloud side of speculative decoding as a state object (no I/O, no clocks).

Words used here (as in drafter.py): *committed* output tokens, *frontier* = their count,
*epoch* = rejections so far, *fixed* tokens (committed by the device, unseen here), and:
- *request*: a parsed VerifyRequest: fixed tokens, then draft tokens with the draft rows the
  cloud holds (decoded payloads; under separate rejection only draft(x) at the token).
- *final*: no drafts follow in this epoch, so a fully accepted request earns a bonus token.
  A non-final request that is fully accepted earns nothing: the next position is verified
  against the next request's first draft (PicoSpec's parallel drafting continues from the
  block's tail), so every position gets exactly one target draw either way.

With `config.eta > 0` every draft position is verified against RAPID's augmented target p_hat
(the rule `tandem.sampling.acceptance.Augmented`: the target's law shifted toward the
transmitted draft law there) and no bonus is drawn.

`verify(request)` runs one forward pass of the target over fixed + drafts (preemptible through
`cancel`), then judges the drafts with the one rejection sampler under the session's rule
(`tandem.sampling.acceptance.judge`), each position with its own generator
(`tandem.sampling.seeds.PositionDraws`, as the decoding core draws), and rolls the cache back
to the committed tokens. Requests that arrive for an old epoch or another position are stale
(`accepts` is False) and are dropped by the caller.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import torch

from tandem.codecs import TopKCodec
from tandem.models.base import CausalLM
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.context import LMContext
from tandem.sampling.acceptance import Augmented, Rule, Standard, judge_logits
from tandem.sampling.seeds import PositionDraws


@dataclass(frozen=True)
class Request:
    seq: int
    epoch: int
    position: int  # position of the first fixed token (or of the first draft if none)
    fixed: tuple[int, ...]
    drafts: tuple[int, ...]
    draft_rows: torch.Tensor | None  # [len(drafts), vocab] or None when there are no drafts
    final: bool

    @property
    def end(self) -> int:
        return self.position + len(self.fixed) + len(self.drafts)


@dataclass(frozen=True)
class Result:
    seq: int  # of the last request verified
    epoch: int  # the epoch the drafts belonged to
    position: int  # position of the first draft
    num_accepted: int
    next_token: int | None  # recovered or bonus token (None under separate rejection)
    target_payload: bytes  # separate rejection: top-K target row (codec "top-k")
    rejected: bool  # a draft was rejected: drafts after it are void, the epoch advanced
    verify_s: float  # forward pass + verification time


def merge(requests: list[Request]) -> list[Request]:
    """Join contiguous requests of one epoch into one (verified in a single forward pass)."""
    merged: list[Request] = []
    for request in requests:
        last = merged[-1] if merged else None
        if (
            last is not None
            and not last.final
            and not request.fixed
            and request.epoch == last.epoch
            and request.position == last.end
        ):
            rows = [r for r in (last.draft_rows, request.draft_rows) if r is not None]
            merged[-1] = replace(
                last,
                seq=request.seq,
                drafts=last.drafts + request.drafts,
                draft_rows=torch.cat(rows) if rows else None,
                final=request.final,
            )
        else:
            merged.append(request)
    return merged


class Verifier:
    """Cloud state for one generation. Call `prefill()` before anything else."""

    def __init__(
        self, lm: CausalLM, prompt_ids: list[int], config: SpecConfig, *, eos_id: int | None
    ) -> None:
        self.lm = lm
        self.config = config
        self.ctx = LMContext(lm, prompt_ids, token_calls=config.verify_calls == "token")
        self.eos_id = eos_id if config.stop_at_eos else None
        self.rule = make_rule(config)
        self.committed: list[int] = []
        self.epoch = 0
        self.cancel = threading.Event()
        self.forward_passes = 0

    def prefill(self) -> None:
        self.ctx.prefill()

    @property
    def frontier(self) -> int:
        return len(self.committed)

    def accepts(self, request: Request) -> bool:
        return request.epoch == self.epoch and request.position == self.frontier

    def rollback(self, position: int, epoch: int) -> None:
        """An Interrupt: forget output tokens from `position` on, continue with `epoch`."""
        position = max(0, min(position, self.frontier))
        del self.committed[position:]
        self.ctx.truncate(position)
        self.epoch = epoch

    def verify(self, request: Request) -> Result:
        """One forward pass over fixed + drafts, then position-by-position verification."""
        assert self.accepts(request), (request.epoch, request.position, self.epoch, self.frontier)
        start = time.perf_counter()
        first = request.position + len(request.fixed)  # position of the first draft
        room = max(0, self.config.max_new_tokens - first)
        drafts = request.drafts[:room]
        rows = self.ctx.logits(request.fixed + drafts, cancel=self.cancel)  # [f + n + 1, V]
        self.forward_passes += 1
        self.committed.extend(request.fixed)
        target_rows = rows[len(request.fixed) :]  # [n + 1, V]
        # augmented: no draft law at the bonus position, so no bonus (config.py)
        final = request.final and not (self.config.augmented and drafts)
        num_accepted, next_token, payload = self._verify_positions(
            first, drafts, request.draft_rows, target_rows, final
        )
        self.committed.extend(drafts[:num_accepted])
        self.ctx.truncate(self.frontier)
        epoch = self.epoch
        rejected = bool(payload) or (next_token is not None and num_accepted < len(drafts))
        if rejected:
            self.epoch += 1
        if next_token is not None:
            self.committed.append(next_token)
            self.ctx.append([next_token])
        return Result(
            seq=request.seq,
            epoch=epoch,
            position=first,
            num_accepted=num_accepted,
            next_token=next_token,
            target_payload=payload,
            rejected=rejected,
            verify_s=time.perf_counter() - start,
        )

    def _verify_positions(
        self,
        first: int,
        drafts: tuple[int, ...],
        draft_rows: torch.Tensor | None,  # [>= len(drafts), vocab]
        target_rows: torch.Tensor,  # [len(drafts) + 1, vocab] logits
        final: bool,
    ) -> tuple[int, int | None, bytes]:
        n = len(drafts)
        verdict, laws = judge_logits(
            self.rule,
            torch.tensor(drafts, dtype=torch.int64),
            draft_rows[:n] if n else None,
            target_rows,
            PositionDraws(self.config.seed, "verify", first),
            sampling=self.config.law_sampling(),
            laws=self.config.separate,  # the top-K downlink sends the law of a rejection
        )
        accepted = drafts[: verdict.num_accepted]
        if self.eos_id in accepted:  # nothing after an accepted eos counts
            return accepted.index(self.eos_id) + 1, None, b""
        if verdict.num_accepted < n:
            if self.config.separate:  # the device draws the recovered token from the top-K
                codec = TopKCodec(k=self.config.downlink_k)
                return verdict.num_accepted, None, codec.encode(laws.verify[verdict.num_accepted])
            return verdict.num_accepted, verdict.next_token, b""
        if final and first + n < self.config.max_new_tokens:
            return n, verdict.next_token, b""
        return n, None, b""


def make_rule(config: SpecConfig) -> Rule:
    """The session's acceptance rule: the target's law, or RAPID's p_hat when eta > 0."""
    if not config.augmented:
        return Standard()
    return Augmented(
        eta=config.eta,
        greedy=config.augmented_greedy,
        tail=config.tail,
        tail_ratio=config.tail_ratio,
    )
