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


class Freeing:
    """The model, with a `free` (as llama.cpp's) that records which states it was given."""

    def __init__(self, lm) -> None:
        self.lm, self.freed = lm, []

    def free(self, state) -> None:
        self.freed.append(state)

    def __getattr__(self, name):
        return getattr(self.lm, name)


def test_release_frees_the_state_through_the_backend(tiny_lm, prompt_ids):
    lm = Freeing(tiny_lm)
    ctx = LMContext(lm, prompt_ids)
    ctx.prefill()
    state = ctx.state
    ctx.release()
    assert ctx.state is None and lm.freed == [state]
    ctx.release()  # twice: nothing more
    assert lm.freed == [state]


@pytest.mark.parametrize("pipeline,codec", [("sync", "dense"), ("eager", "dense")])
def test_the_cloud_frees_its_kv_before_it_says_the_session_is_over(
    tiny_lm, prompt_ids, monkeypatch, pipeline, codec
):
    """The device starts its next session once the cloud's stats arrive; the cloud's rows must
    be gone by then, so the next session's rows lie as on a fresh model (context.py)."""
    import asyncio

    from tandem.protocols.spec import run_pair
    from tandem.protocols.spec.cloud import CloudSession

    seen = []
    send_stats = CloudSession._send_stats

    async def spy(self):
        seen.append(self.verifier.ctx.state)
        await send_stats(self)

    monkeypatch.setattr(CloudSession, "_send_stats", spy)
    config = SpecConfig(pipeline=pipeline, codec=codec, temperature=0.0, max_new_tokens=6)
    asyncio.run(run_pair(device_lm=tiny_lm, cloud_lm=tiny_lm, prompt_ids=prompt_ids, config=config))
    assert seen == [None]


def test_cloud_ar_frees_its_kv_before_it_sends_its_stats(tiny_lm, prompt_ids):
    import asyncio

    from tandem.baselines.spec_baselines import run_cloud_ar, serve_cloud_ar
    from tandem.protocols.pair import run_in_process

    lm = Freeing(tiny_lm)
    config = SpecConfig(temperature=0.0, max_new_tokens=5, stop_at_eos=False)

    async def device(channel, kill_cloud):
        report = await run_cloud_ar(channel, tiny_lm.tokenizer, prompt_ids, config)
        return report, list(lm.freed)  # what the cloud had freed when its stats arrived

    (report, freed), _ = asyncio.run(
        run_in_process(device, lambda channel: serve_cloud_ar(channel, lm))
    )
    assert len(report.tokens) == 5 and report.cloud["tokens"] == 5
    assert len(freed) == 1
