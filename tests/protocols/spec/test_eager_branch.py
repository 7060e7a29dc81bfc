"""Eager branches (eager.py, *branch*): the device drafts past an unsure position on its second
choice and the cloud takes that branch as the next chain when it commits the branch's token.
The state objects' rules, the wire form, and greedy runs over a slow link (== the target's
greedy output, branches taken). Laws: tests/exactness/test_eager_law.py."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tandem.codecs import make_codec
from tandem.errors import TandemError
from tandem.protocols.spec import SpecConfig, run_pair, wire
from tandem.protocols.spec.eager import EagerDrafter, EagerVerifier
from tandem.protocols.spec.verifier import Request
from tandem.transport import LinkConfig

from .fakes import TableLM
from .test_eager import PROMPT, eager_config, table_greedy


def branching(**kw) -> SpecConfig:
    return eager_config(**{"codec": "dense", "branch_below": 1.0, "branch_len": 2, **kw})


def one_hot(tokens, vocab: int = 8) -> torch.Tensor:
    rows = torch.zeros(len(tokens), vocab)
    for i, token in enumerate(tokens):
        rows[i, token] = 1.0
    return rows


def test_config_allows_branches_only_in_the_eager_pipeline():
    with pytest.raises(TandemError, match="branch_below > 0 needs pipeline eager"):
        SpecConfig(pipeline="async", branch_below=0.5)
    with pytest.raises(TandemError, match="branch_below must be in"):
        SpecConfig(pipeline="eager", branch_below=1.5)
    with pytest.raises(TandemError, match="branch_len"):
        SpecConfig(pipeline="eager", branch_below=0.5, branch_len=0)
    assert SpecConfig(pipeline="async").branch_below == 0.0  # off by default


def test_a_branch_is_the_chain_a_new_epoch_would_draft_and_leaves_the_cache_as_it_was():
    draft = TableLM(8, "d")
    drafter = EagerDrafter(draft, PROMPT, branching(), eos_id=None)
    drafter.prefill()
    first = drafter.draft_next()
    second_choice = int(draft.row(tuple(PROMPT)).topk(2).indices[1])
    assert drafter.branch is not None and drafter.branch.position == 0
    assert drafter.branch.token == second_choice  # greedy drafts the first choice
    assert not drafter.branch_due()  # its position's draft is not sent yet
    drafter.take_chunk()
    chunk = drafter.draft_branch()
    assert chunk.epoch == 1 and chunk.position == 0 and chunk.fixed == (second_choice,)
    assert drafter.ctx.ids == PROMPT + [first.token]  # the draft model's sequence as before
    # the branch's drafts are what a drafter that had committed the branch token would draft
    fresh = EagerDrafter(draft, PROMPT + [second_choice], branching(), eos_id=None)
    fresh.prefill()
    assert [d.token for d in chunk.drafts] == [fresh.draft_next().token for _ in range(2)]
    assert drafter.draft_next().token == int(draft.row((*PROMPT, first.token)).argmax())


def test_adopting_the_branch_token_promotes_the_branch_and_another_token_drops_it():
    draft = TableLM(8, "d")
    for promote in (True, False):
        drafter = EagerDrafter(draft, PROMPT, branching(), eos_id=None)
        drafter.prefill()
        first = drafter.draft_next()
        drafter.take_chunk()
        chunk = drafter.draft_branch()
        branch_token = chunk.fixed[0]
        token = branch_token if promote else next(
            t for t in range(8) if t not in (branch_token, first.token)
        )  # fmt: skip
        outcome = drafter.adopt(0, (token,))
        assert outcome.rejected and drafter.epoch == 1 and drafter.branch is None
        if promote:
            tokens = [d.token for d in chunk.drafts]
            assert [d.token for d in drafter.drafts] == tokens and drafter.sent == 2
            assert drafter.ctx.ids == PROMPT + [branch_token, *tokens]
            assert drafter.branches == {"opened": 1, "sent": 1, "promoted": 1}
        else:
            assert drafter.drafts == [] and drafter.sent == 0
            assert drafter.branches["promoted"] == 0


def test_a_branch_travels_as_a_request_with_its_token_fixed():
    draft = TableLM(8, "d")
    drafter = EagerDrafter(draft, PROMPT, branching(), eos_id=None)
    drafter.prefill()
    drafter.draft_next()
    drafter.take_chunk()
    chunk = drafter.draft_branch()
    msg = wire.request_message(7, chunk, "dense")
    assert len(msg.distributions) == len(msg.tokens) == 3 and msg.distributions[0] == b""
    parsed = wire.parse_request(msg, codec_name="dense", codec=make_codec("dense"), vocab_size=8)
    assert parsed.epoch == 1 and parsed.position == 0 and parsed.fixed == chunk.fixed
    assert parsed.drafts == tuple(d.token for d in chunk.drafts)
    assert parsed.draft_rows.shape == (2, 8)


def test_the_cloud_takes_a_branch_only_where_the_chain_died_on_its_token():
    target = TableLM(8, "t")
    truth = table_greedy(target, PROMPT, 3)
    wrong = (truth[0] + 1) % 8

    def branch(token, epoch=1):
        drafts = (truth[1], truth[2])
        return Request(seq=2, epoch=epoch, position=0, fixed=(token,), drafts=drafts,
                       draft_rows=one_hot(drafts), final=False)  # fmt: skip

    verifier = EagerVerifier(target, PROMPT, branching(), eos_id=None)
    verifier.prefill()
    chain = Request(seq=1, epoch=0, position=0, fixed=(), drafts=(wrong,),
                    draft_rows=one_hot((wrong,)), final=False)  # fmt: skip
    result = verifier.verify(verifier.admit(chain).verify)
    assert result.rejected and verifier.died_at == 0 and verifier.committed == truth[:1]
    assert verifier.admit(branch(wrong)).stale  # another token than the one committed
    assert verifier.admit(branch(truth[0], epoch=2)).stale  # not the next epoch
    with pytest.raises(TandemError, match="at most one fixed token"):
        verifier.admit(Request(seq=3, epoch=1, position=0, fixed=(1, 2), drafts=(),
                               draft_rows=None, final=False))  # fmt: skip
    admission = verifier.admit(branch(truth[0]))
    assert not admission.stale and verifier.chain_epoch == 1 and verifier.branches == 1
    assert admission.verify.position == 1 and admission.verify.drafts == (truth[1], truth[2])
    result = verifier.verify(admission.verify)
    assert not result.rejected and verifier.committed == truth
    # an alive chain (its draft matched) makes any branch at that position stale
    alive = EagerVerifier(target, PROMPT, branching(), eos_id=None)
    alive.prefill()
    alive.verify(alive.admit(Request(seq=1, epoch=0, position=0, fixed=(), drafts=(truth[0],),
                                     draft_rows=one_hot(truth[:1]), final=False)).verify)  # fmt: skip
    assert alive.admit(branch(wrong)).stale and alive.admit(branch(truth[0])).stale


def test_greedy_with_branches_equals_target_greedy_over_a_slow_link():
    """Timed fakes: branches at every draft (branch_below 1), some taken by both sides."""
    target = TableLM(16, "t", step_delay_s=0.03)  # slower than a round trip: chains verify
    draft = TableLM(16, "d", correlate_with=target, mix=0.6, step_delay_s=0.002)
    n = 60
    report, cloud = asyncio.run(
        run_pair(
            device_lm=draft,
            cloud_lm=target,
            prompt_ids=PROMPT,
            config=branching(max_new_tokens=n, branch_len=3),
            link=LinkConfig(delay_ms=5.0, jitter_ms=1.0, seed=1),
        )
    )
    assert report.tokens == table_greedy(target, PROMPT, n)
    assert report.cloud["agrees_with_device"]
    assert report.branches["promoted"] > 0 and cloud["branches_promoted"] > 0
    assert report.branches["promoted"] >= cloud["branches_promoted"]
    assert len(report.branch_s) == report.branches["sent"]
