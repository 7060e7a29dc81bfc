"""Pipeline eager ("the cloud never idles"): the state objects' rules (admit, adopt, AR step),
both asyncio layers over an emulated link, greedy output == the target's plain greedy output
(tiny models; the real Qwen pair in a slow test). Laws: tests/exactness/test_eager_law.py."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import torch

from tandem.config import SamplingConfig
from tandem.errors import TandemError
from tandem.protocols.local import generate
from tandem.protocols.spec import SpecConfig, run_pair, wire
from tandem.protocols.spec.cloud import serve_session
from tandem.protocols.spec.device import DeviceSession
from tandem.protocols.spec.eager import EagerDrafter, EagerVerifier
from tandem.protocols.spec.verifier import Request
from tandem.transport import (
    End,
    LinkConfig,
    Start,
    TargetToken,
    VerifyRequest,
    VerifyResult,
    control,
    memory_pair,
)

from .fakes import TableLM

PROMPT = [1, 2, 3]


def eager_config(**kw) -> SpecConfig:
    base = {"pipeline": "eager", "temperature": 0.0, "max_new_tokens": 12, "stop_at_eos": False}
    return SpecConfig(**{**base, **kw})


def table_greedy(lm: TableLM, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(lm.row(tuple(prompt + out)).argmax()))
    return out


def request(epoch: int, position: int, drafts: tuple[int, ...], vocab: int = 8) -> Request:
    rows = torch.full((len(drafts), vocab), 1.0 / vocab)
    return Request(
        seq=1, epoch=epoch, position=position, fixed=(), drafts=drafts, draft_rows=rows, final=False
    )


def test_config_refuses_stateful_or_separate_uplinks():
    for codec in ("separate", "c-sqs"):
        with pytest.raises(TandemError, match="eager"):
            SpecConfig(pipeline="eager", codec=codec)
    SpecConfig(pipeline="eager", codec="k-sqs")


def test_admit_skips_matching_committed_drafts_and_kills_a_chain_on_a_mismatch():
    target = TableLM(8, "t")
    verifier = EagerVerifier(target, PROMPT, eager_config(), eos_id=None)
    verifier.prefill()
    ar = [verifier.ar_step() for _ in range(3)]  # the cloud runs ahead: positions 0-2
    assert ar == table_greedy(target, PROMPT, 3) and verifier.ar_steps == 3
    other = (ar[1] + 1) % 8
    # epoch 0: drafts for positions 0-3; 0-2 match the AR tokens (skipped), 3 is verified
    admission = verifier.admit(request(0, 0, (ar[0], ar[1], ar[2], 5)))
    assert admission.skipped == 3 and not admission.stale
    assert admission.verify is not None and admission.verify.position == 3
    assert admission.verify.drafts == (5,) and admission.verify.draft_rows.shape == (1, 8)
    # a mismatch at a committed position kills the chain: later requests of it are stale
    admission = verifier.admit(request(1, 0, (ar[0], other)))
    assert admission.stale and admission.skipped == 1 and verifier.chain_dead
    assert verifier.admit(request(1, 2, (ar[2],))).stale
    assert verifier.admit(request(0, 3, (5,))).stale  # an older epoch
    fresh = verifier.admit(request(2, 2, (ar[2],)))  # a newer epoch starts a new chain
    assert not fresh.stale and fresh.skipped == 1 and fresh.verify is None
    with pytest.raises(TandemError, match="beyond"):
        verifier.admit(request(2, 7, (1,)))


def test_a_rejection_kills_the_chain_and_the_next_ar_step_feeds_the_residual():
    target = TableLM(8, "t")
    verifier = EagerVerifier(target, PROMPT, eager_config(), eos_id=None)
    verifier.prefill()
    truth = table_greedy(target, PROMPT, 3)
    wrong = (truth[1] + 1) % 8
    rows = torch.zeros(2, 8)
    rows[0, truth[0]] = rows[1, wrong] = 1.0  # one-hot drafts (greedy)
    plan = verifier.admit(
        Request(
            seq=1,
            epoch=0,
            position=0,
            fixed=(),
            drafts=(truth[0], wrong),
            draft_rows=rows,
            final=False,
        )
    ).verify
    result = verifier.verify(plan)
    assert result.rejected and result.num_accepted == 1 and result.next_token == truth[1]
    assert verifier.chain_dead and verifier.committed == truth[:2]
    assert verifier.ar_step() == truth[2]  # decodes on from the residual
    assert not verifier.last_step_free  # the residual had to be fed: a forward pass


def test_the_ar_step_after_a_fully_accepted_pass_is_free_and_says_so():
    """Its row came with the verification: no forward pass, so its time must not teach anyone
    the AR step's cost (the cloud sends step_s = 0 and notes no pass)."""
    target = TableLM(8, "t")
    verifier = EagerVerifier(target, PROMPT, eager_config(), eos_id=None)
    verifier.prefill()
    truth = table_greedy(target, PROMPT, 5)
    assert verifier.step_free  # the prefill's row is there
    assert verifier.ar_step() == truth[0] and verifier.last_step_free
    assert not verifier.step_free  # the token just drawn is pending: the next step is a pass
    assert verifier.ar_step() == truth[1] and not verifier.last_step_free
    rows = torch.zeros(2, 8)
    rows[0, truth[2]] = rows[1, truth[3]] = 1.0
    plan = verifier.admit(Request(seq=1, epoch=0, position=2, fixed=(), drafts=tuple(truth[2:4]),
                                  draft_rows=rows, final=False)).verify  # fmt: skip
    result = verifier.verify(plan)
    assert result.num_accepted == 2 and not result.rejected
    passes = verifier.ctx.forward_passes
    assert verifier.step_free
    assert verifier.ar_step() == truth[4] and verifier.last_step_free
    assert verifier.ctx.forward_passes == passes
    assert verifier.ar_step() is not None and not verifier.last_step_free


def test_preemption_pays_only_for_live_drafts_and_weighs_the_chance_they_differ():
    """worth_preempting (eager.py: *preempt*): never for a stale chain, a request with nothing
    past the step's position, or one whose draft differs from a committed token (admit would
    drop it); else below planner.preempt_threshold at the cloud's alpha, which the content
    checks and verdicts teach."""
    target = TableLM(8, "t")
    verifier = EagerVerifier(target, PROMPT, eager_config(), eos_id=None)
    verifier.prefill()
    ar = [verifier.ar_step() for _ in range(2)]  # committed 0-1; the step at 2 is running
    other = (ar[1] + 1) % 8
    assert verifier.worth_preempting(0, 2, (5, 5), 10.0)  # nothing measured yet: preempt
    verifier.note_pass(1, 0.072)
    verifier.note_pass(5, 0.092)  # 5 ms a token beyond the first
    live = (ar[0], ar[1], 5, 5, 5)  # drafts 0-4; 0-1 match, 2-4 live
    assert verifier.alpha == 1.0
    assert verifier.worth_preempting(0, 0, live, 0.066)  # < t_ar - per_token = 67 ms
    assert not verifier.worth_preempting(0, 0, live, 0.068)
    assert not verifier.worth_preempting(0, 0, (ar[0], other, 5), 0.0)  # dead on arrival
    assert not verifier.worth_preempting(0, 1, (ar[1], 5), 0.0)  # nothing beyond position 2
    verifier.alpha = 0.75  # 0.75 * 67 - 0.25 * 5 * 3 = 46.5 ms
    assert verifier.worth_preempting(0, 0, live, 0.046)
    assert not verifier.worth_preempting(0, 0, live, 0.047)
    verifier.alpha = 1.0
    assert verifier.admit(request(0, 0, (ar[0], ar[1]))).skipped == 2 and verifier.alpha == 1.0
    assert verifier.admit(request(1, 0, (ar[0], other))).stale  # one match, one mismatch
    assert verifier.alpha == pytest.approx(0.9)
    assert not verifier.worth_preempting(1, 2, (5, 5), 0.0)  # the chain is dead now


def test_the_cloud_takes_the_free_step_before_drafts_that_wait():
    """Drafts for positions 0-2 arrive while the target prefills. The prefill's row makes the
    step at position 0 free, so its token goes down first (a whole pass before the verdict on
    the draft there would); the matching draft is skipped and drafts 1-2 verified in one pass
    (eager.py: free step first)."""
    target = TableLM(8, "t", step_delay_s=0.05)  # the prefill and a pass: 50 ms a token
    draft = TableLM(8, "d", correlate_with=target, mix=1.0)  # drafts = the target's argmax
    config = eager_config(codec="dense", max_new_tokens=4)
    drafter = EagerDrafter(draft, PROMPT, config, eos_id=None)
    drafter.prefill()
    for _ in range(3):
        drafter.draft_next()
    chunk = drafter.take_chunk()

    async def main():
        device_channel, cloud_channel = memory_pair()
        cloud = asyncio.create_task(serve_session(cloud_channel, target))
        await device_channel.send(wire.start_message("spec", config.to_json(), PROMPT))
        await device_channel.send(wire.request_message(1, chunk, config.codec))
        down, committed = [], []
        while len(committed) < 4:
            msg = await device_channel.recv()
            if isinstance(msg, TargetToken):
                down.append(("token", msg.position))
                committed.extend(wire.parse_token(msg)["tokens"])
            elif isinstance(msg, VerifyResult):
                position = wire.parse_result(msg)["position"]
                down.append(("verdict", position))
                committed.extend(int(t) for t in msg.arrays["tokens"][len(committed) - position :])
        await device_channel.send(control.end(tuple(committed)))
        stats = await cloud
        await device_channel.close()
        return down, committed, stats

    down, committed, stats = asyncio.run(asyncio.wait_for(main(), 30))
    assert down[0] == ("token", 0)  # before any verdict
    assert ("verdict", 1) in down and committed == table_greedy(target, PROMPT, 4)
    assert stats["skipped_drafts"] == 1 and stats["drafts_accepted"] == 2
    assert stats["free_ar_steps"] == 2  # position 0 (the prefill's row), 3 (after the pass)


def test_adopt_keeps_matching_drafts_and_restarts_after_a_mismatch():
    target = TableLM(8, "t")
    draft = TableLM(8, "d", correlate_with=target, mix=1.0)  # drafts = the target's argmax
    drafter = EagerDrafter(draft, PROMPT, eager_config(codec="dense"), eos_id=None)
    drafter.prefill()
    for _ in range(3):
        drafter.draft_next()
    drafter.take_chunk()
    truth = [d.token for d in drafter.drafts]
    outcome = drafter.adopt(0, truth[:1])  # an AR token equal to the draft in flight
    assert outcome.num_accepted == 1 and not outcome.rejected
    assert drafter.sent == 2 and len(drafter.drafts) == 2 and drafter.epoch == 0
    other = (truth[1] + 1) % 8
    outcome = drafter.adopt(0, (truth[0], other))  # position 0 known already: skipped
    assert outcome.rejected and outcome.committed == (other,)
    assert drafter.drafts == [] and drafter.sent == 0 and drafter.epoch == 1
    assert drafter.ctx.ids == PROMPT + [truth[0], other]
    with pytest.raises(TandemError):
        drafter.adopt(5, (1,))


def test_contradicts_names_exactly_the_tokens_that_kill_the_chain():
    """The reader's interrupt rule: a committed token that differs from a held draft at its
    position (and only that) says the draft step in flight is wasted."""
    target = TableLM(8, "t")
    draft = TableLM(8, "d", correlate_with=target, mix=1.0)
    drafter = EagerDrafter(draft, PROMPT, eager_config(codec="dense"), eos_id=None)
    drafter.prefill()
    for _ in range(3):
        drafter.draft_next()
    held = [d.token for d in drafter.drafts]  # positions 0-2
    other = [(t + 1) % 8 for t in held]
    assert not drafter.contradicts(0, held)  # all equal
    assert not drafter.contradicts(1, held[1:2])
    assert drafter.contradicts(1, (other[1],))
    assert drafter.contradicts(0, (held[0], held[1], other[2]))  # the last one differs
    assert not drafter.contradicts(3, (5,))  # no draft held there: nothing to contradict
    drafter.adopt(0, held[:1])  # position 0 committed: positions count from the output's start
    assert not drafter.contradicts(0, (other[0],))  # already committed, no draft there
    assert drafter.contradicts(2, (other[2],)) and not drafter.contradicts(2, (held[2],))
    assert drafter.drafts and drafter.epoch == 0  # a query: nothing changed


class _Once(dict):
    """slow_positions that slow one decode only (the key is read once)."""

    def get(self, key, default=None):
        return self.pop(key, default)


def test_an_ar_token_that_kills_the_chain_interrupts_the_draft_step_in_flight():
    """A scripted cloud: the device sends its draft for position 0 and starts a 2 s draft step;
    the cloud streams an AR token for position 0 that differs from that draft. The reader stops
    the step at once (cancelled_steps), and the new chain's first request follows within a
    fraction of the 2 s (without the interrupt the step would run to its end first)."""
    draft = TableLM(8, "d", step_delay_s=0.002)
    draft.slow_positions = _Once({len(PROMPT): 2.0})  # the decode of draft 0 (for draft 1)
    n = 3
    config = eager_config(codec="dense", max_new_tokens=n, draft_len=1)

    async def main():
        device_channel, cloud_channel = memory_pair()
        session = DeviceSession(device_channel, draft, PROMPT, config)
        device = asyncio.create_task(session.run())
        assert isinstance(await cloud_channel.recv(), Start)
        first = await cloud_channel.recv()  # the draft for position 0, sent before the slow step
        assert isinstance(first, VerifyRequest) and first.position == 0
        wrong = (int(first.tokens[0]) + 1) % 8
        await asyncio.sleep(0.05)  # the slow step is under way
        sent = time.perf_counter()
        await cloud_channel.send(wire.token_message(0, wrong, 0.01))
        second = await cloud_channel.recv()  # the new chain's first draft, after `wrong`
        gap = time.perf_counter() - sent
        for position in range(1, n):
            await cloud_channel.send(wire.token_message(position, 0, 0.01))
        while not isinstance(await cloud_channel.recv(), End):
            pass
        await cloud_channel.send(control.stats({}))
        report = await device
        await cloud_channel.close()
        return report, second, gap, wrong

    report, second, gap, wrong = asyncio.run(main())
    assert second.position == 1 and report.tokens == [wrong, 0, 0]
    assert report.cancelled_steps >= 1  # (the AR tokens after it may stop more)
    assert gap < 1.0  # the 2 s step was stopped, not waited out


@pytest.mark.parametrize("codec,params", [("dense", {}), ("k-sqs", {"k": 8})])
def test_greedy_equals_target_greedy_over_a_slow_link(codec, params):
    """Timed fakes: the cloud decodes on its own during every round trip (AR tokens), drafts
    arrive for positions it has committed (skipped or stale), the rest is verified."""
    target = TableLM(16, "t", step_delay_s=0.01)
    draft = TableLM(16, "d", correlate_with=target, mix=0.8, step_delay_s=0.002)
    n = 40
    config = eager_config(codec=codec, codec_params=params, max_new_tokens=n)
    report, cloud = asyncio.run(
        run_pair(
            device_lm=draft,
            cloud_lm=target,
            prompt_ids=PROMPT,
            config=config,
            link=LinkConfig(delay_ms=25.0, jitter_ms=5.0, seed=1),
        )
    )
    assert report.tokens == table_greedy(target, PROMPT, n)
    assert report.cloud["agrees_with_device"]
    assert cloud["ar_tokens"] > 0 and cloud["drafts_verified"] > 0  # both branches ran
    assert cloud["ar_tokens"] + cloud["drafts_accepted"] <= n


@pytest.mark.parametrize("codec,params", [("dense", {}), ("k-sqs", {"k": 8})])
def test_tiny_models_greedy_equals_plain_greedy(tiny_lm, tiny_target, prompt_ids, codec, params):
    n = 24
    reference = generate(
        tiny_target, prompt_ids, SamplingConfig(temperature=0, max_new_tokens=n, stop_at_eos=False)
    ).tokens
    config = eager_config(codec=codec, codec_params=params, max_new_tokens=n)
    report, _ = asyncio.run(
        run_pair(
            device_lm=tiny_lm,
            cloud_lm=tiny_target,
            prompt_ids=prompt_ids,
            config=config,
            link=LinkConfig(delay_ms=3.0, jitter_ms=2.0, seed=1),
        )
    )
    assert report.tokens == reference
    assert report.cloud["agrees_with_device"]


@pytest.mark.slow
@pytest.mark.parametrize("branch_below", [0.0, 0.9])
def test_qwen_pair_eager_greedy_equals_the_cloud_models_greedy(real_lm, greedy, branch_below):
    """The real pair on llama.cpp, 16 tokens: equal to the 1.5B model's plain greedy output
    or departing only at a near-tie (conftest.assert_greedy_equal); also with branches
    (the draft model's cache cut back and re-fed around each)."""
    from tandem.models.registry import load_model

    cloud_lm = load_model("qwen2.5-coder-1.5b", progress=False)
    try:
        n = 16
        ids = cloud_lm.tokenizer.encode('def fibonacci(n):\n    """Return the n-th Fibonacci."""\n')
        expected, margins = greedy.with_margins(cloud_lm, ids, n)
        config = eager_config(
            codec="k-sqs", codec_params={"k": 8}, max_new_tokens=n, branch_below=branch_below
        )
        report, _ = asyncio.run(
            run_pair(
                device_lm=real_lm,
                cloud_lm=cloud_lm,
                prompt_ids=ids,
                config=config,
                link=LinkConfig(delay_ms=10.0),
            )
        )
        greedy.assert_equal(cloud_lm, report.tokens, expected, margins)
        assert bool(report.branches.get("sent")) == bool(branch_below)
    finally:
        del cloud_lm
        gc.collect()
