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
from tandem.protocols.spec.planner import Branching, Controller, Costs
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


def test_the_drafter_counts_its_drafts_as_branches_see_them():
    """At adoption: a matched draft counts as match (unsure or not), a mismatch as miss, and
    an unsure miss whose committed token is the branch token as second; drafts of the voided
    chain and a taken branch's drafts (not drafted through the hook) are not counted. With
    `branching` off the counts go on but no branch opens."""
    draft = TableLM(8, "d")
    for on in (True, False):
        drafter = EagerDrafter(draft, PROMPT, branching(branch_len=2), eos_id=None)
        drafter.branching = on
        drafter.prefill()
        first = drafter.draft_next()  # unsure (branch_below 1): a branch opens if on
        assert (drafter.branch is not None) == on
        second = drafter.draft_next()
        drafter.take_chunk()
        if on:
            drafter.draft_branch()
        branch_token = drafter._unsure[1][1]  # the most likely token other than the draft
        drafter.adopt(0, (first.token,))
        assert drafter.confidence == dict(match=1, unsure_match=1, miss=0, unsure_miss=0, second=0)
        drafter.adopt(1, (branch_token,))  # the second draft missed, on its branch token
        assert drafter.confidence["miss"] == drafter.confidence["second"] == 1
        assert drafter._unsure == {} and drafter.branches["opened"] == int(on)
        assert second.token != branch_token
    sure = EagerDrafter(draft, PROMPT, branching(branch_below=1e-6), eos_id=None)
    sure.prefill()
    token = sure.draft_next().token
    sure.adopt(0, ((token + 1) % 8,))
    assert sure.confidence == dict(match=0, unsure_match=0, miss=1, unsure_miss=0, second=0)


def test_a_controller_turns_branches_off_where_they_cannot_pay():
    """The controller learns the counts and prices branches with the epoch model: on where the
    target's token is often the draft's second choice, off where it never is."""
    paper = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=0.2)
    right, wrong = Controller(prior=paper), Controller(prior=paper)
    for _ in range(10):  # 128 drafts a generation, 20% missed
        right.observe_confidence(match=102, unsure_match=2, miss=26, unsure_miss=20, second=15)
        wrong.observe_confidence(match=102, unsure_match=90, miss=26, unsure_miss=26, second=0)
    assert right.branching(4).second == pytest.approx(0.75, abs=0.02)
    pay, gain = right.branches_pay(4, 4)
    assert pay and gain > 1.02 and right.branch_choice
    pay, gain = wrong.branches_pay(4, 4)
    assert not pay and gain < 0.95 and not wrong.branch_choice
    assert wrong.branches_pay(4, 4) == (pay, gain)  # remembered


def test_a_session_with_a_controller_branches_as_it_says():
    """Eager with branches and a controller: the device prices branches beside the generation
    and applies the answer (here: no, the prior says every draft is unsure and the target's
    token never second: branches would only cost); the output stays the target's."""
    target = TableLM(16, "t", step_delay_s=0.03)
    draft = TableLM(16, "d", correlate_with=target, mix=0.6, step_delay_s=0.002)
    prior = Costs(t_draft=0.002, decode_base=0.029, decode_per_token=0.001, rtt=0.01)
    controller = Controller(prior=prior, branching_prior=Branching(0.9, 1.0, 0.0))
    n = 30
    report, _ = asyncio.run(
        run_pair(device_lm=draft, cloud_lm=target, prompt_ids=PROMPT,
                 config=branching(max_new_tokens=n), link=LinkConfig(delay_ms=5.0),
                 controller=controller)
    )  # fmt: skip
    assert report.tokens == table_greedy(target, PROMPT, n)
    assert report.branches["chosen"] is False and report.branches["predicted_gain"] < 1
    assert controller.branch_choice is False
    counts = report.branches["confidence"]
    assert counts["match"] + counts["miss"] > 0
    assert controller.branching(2).unsure_match > 0.9  # learnt: branch_below 1, all unsure
