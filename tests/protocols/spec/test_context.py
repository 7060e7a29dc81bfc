"""LMContext's token calls (SpecConfig.verify_calls = "token"): a block fed one token per
forward pass gives the rows of plain one-step decoding, keeps the protocol's cancellation and
crop contracts, and is what the verifier uses when asked."""

from __future__ import annotations

import threading

import pytest
import torch

from tandem.errors import TandemError
from tandem.models.base import Cancelled
from tandem.protocols.spec import SpecConfig
from tandem.protocols.spec.context import LMContext
from tandem.protocols.spec.verifier import Verifier

BLOCK = [5, 17, 42, 99]


def one_step_rows(lm, ids, block):
    """Next-token logits before each block token and after the last, one decode per token."""
    state = lm.prefill(ids)
    rows = [state.logits[0].clone()]
    for token in block:
        rows.append(lm.decode(state, [token])[0, -1].clone())
    return torch.stack(rows)


def test_token_calls_give_one_step_rows(tiny_lm, prompt_ids):
    ctx = LMContext(tiny_lm, prompt_ids, token_calls=True)
    ctx.prefill()
    rows = ctx.logits(BLOCK)
    assert torch.equal(rows, one_step_rows(tiny_lm, prompt_ids, BLOCK))
    assert ctx.fed == len(prompt_ids) + len(BLOCK) and ctx.output == BLOCK
    assert ctx.forward_passes == 1  # one logical pass of the protocol
    block = LMContext(tiny_lm, prompt_ids)
    block.prefill()
    assert torch.allclose(block.logits(BLOCK), rows, atol=1e-4)  # the same law, another shape


def test_token_calls_feed_pending_tokens_one_by_one(tiny_lm, prompt_ids):
    ctx = LMContext(tiny_lm, prompt_ids, token_calls=True)
    ctx.prefill()
    ctx.append(BLOCK[:2])  # committed, not yet fed
    rows = ctx.logits(BLOCK[2:])
    assert torch.equal(rows, one_step_rows(tiny_lm, prompt_ids, BLOCK)[2:])


class CancelAfter:
    """The model, with `cancel` set once `calls` decodes have completed."""

    def __init__(self, lm, cancel: threading.Event, calls: int) -> None:
        self.lm, self.cancel, self.calls = lm, cancel, calls

    def decode(self, *args, **kwargs):
        out = self.lm.decode(*args, **kwargs)
        self.calls -= 1
        if self.calls == 0:
            self.cancel.set()
        return out

    def __getattr__(self, name):
        return getattr(self.lm, name)


def test_a_cancelled_token_block_changes_nothing(tiny_lm, prompt_ids):
    cancel = threading.Event()
    ctx = LMContext(CancelAfter(tiny_lm, cancel, calls=2), prompt_ids, token_calls=True)
    ctx.prefill()
    before_ids, before_logits = list(ctx.ids), ctx.state.logits.clone()
    with pytest.raises(Cancelled):
        ctx.logits(BLOCK, cancel=cancel)
    assert ctx.ids == before_ids and ctx.fed == len(prompt_ids)
    assert torch.equal(ctx.state.logits, before_logits)
    assert torch.equal(ctx.logits(BLOCK), one_step_rows(tiny_lm, prompt_ids, BLOCK))


def test_a_crop_inside_a_token_block_keeps_its_row(tiny_lm, prompt_ids):
    ctx = LMContext(tiny_lm, prompt_ids, token_calls=True)
    ctx.prefill()
    rows = ctx.logits(BLOCK)
    ctx.truncate(2)  # a rejection after the second token
    assert torch.equal(ctx.state.logits[0], rows[2])
    assert torch.equal(ctx.logits()[0], rows[2])


def test_the_verifier_uses_token_calls_when_asked(tiny_lm, prompt_ids):
    for calls, expected in (("block", False), ("token", True)):
        verifier = Verifier(tiny_lm, prompt_ids, SpecConfig(verify_calls=calls), eos_id=None)
        assert verifier.ctx.token_calls is expected
    with pytest.raises(TandemError, match="verify_calls must be one of block, token"):
        SpecConfig(verify_calls="row")
