"""The pipelines' mechanics: rollback after a rejection inside an in-flight block leaves both
KV caches consistent, a rejection preempts the draft step in flight, a device interrupt
cancels the cloud's verification, fast verification, latency-aware truncation, the bit
budget, and outputs that do not depend on timing."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tandem.errors import TandemError
from tandem.protocols.spec import SpecConfig, run_pair, wire
from tandem.protocols.spec.cloud import CloudSession, parse_start, serve_session
from tandem.protocols.spec.device import DeviceSession
from tandem.transport import LinkConfig, VerifyResult, control, memory_pair

from .fakes import fake_pair
from .lockstep import exchange, lockstep, make_sides

ATOL = 1e-4


def fresh_row(lm, ids: list[int]) -> torch.Tensor:
    return lm.score(ids)[-1]


def consistent(ctx, lm) -> bool:
    """The context's next-token logits equal a fresh recomputation of its sequence."""
    return torch.allclose(ctx.logits()[0], fresh_row(lm, ctx.ids), atol=ATOL)


def assert_consistent(side) -> None:
    assert consistent(side.ctx, side.lm)


def fake_greedy(target, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(target.row(tuple(ids)).argmax()))
    return ids[len(prompt) :]


def test_rejection_inside_an_in_flight_block_keeps_both_caches_consistent(
    tiny_lm, tiny_target, prompt_ids
):
    config = SpecConfig(pipeline="async", temperature=0.0, max_new_tokens=40, stop_at_eos=False)
    for offset in range(12):  # find a block whose first rejection is inside it
        drafter, verifier = make_sides(tiny_lm, tiny_target, prompt_ids + [97 + offset], config)
        for _ in range(4):
            drafter.draft_next()
        first = drafter.take_chunk()
        for _ in range(4):
            drafter.draft_next()  # block 2, drafted assuming block 1 is accepted
        second = drafter.take_chunk()
        assert not first.final and second.position == first.position + 4
        result = exchange_chunks(drafter, verifier, config, first)
        if 0 < result.num_accepted < 4:
            break
    else:
        pytest.fail("no block with a rejection inside it")
    assert result.rejected and drafter.epoch == verifier.epoch == 1
    assert drafter.committed == verifier.committed
    assert drafter.drafts == [] and drafter.sent == 0  # block 2 is void on the device...
    stale = make_request(config, second, verifier)
    assert not verifier.accepts(stale)  # ...and on the cloud
    assert_consistent(drafter)
    assert_consistent(verifier)
    while not drafter.done:  # and generation carries on correctly from there
        while drafter.unsent < config.draft_len and drafter.can_draft():
            drafter.draft_next()
        exchange(drafter, verifier, config)
    expected = lockstep(tiny_target, tiny_target, prompt_ids + [97 + offset], config)
    assert drafter.committed == expected


def make_request(config, chunk, verifier):
    from tandem.codecs import make_codec

    from .lockstep import roundtrip

    msg = roundtrip(wire.request_message(1, chunk, config.codec))
    codec = make_codec(config.codec, **config.codec_params)
    return wire.parse_request(
        msg, codec_name=config.codec, codec=codec, vocab_size=verifier.lm.vocab_size
    )


def exchange_chunks(drafter, verifier, config, chunk):
    result = verifier.verify(make_request(config, chunk, verifier))
    fields = wire.parse_result(wire.result_message(result))
    fields.pop("rejected"), fields.pop("verify_s")
    drafter.apply(**fields)
    return result


async def run_sessions(draft_lm, target_lm, prompt, config, link=None):
    """Device and cloud sessions over memory_pair, returning both session objects."""
    device_channel, cloud_channel = memory_pair(link=link)

    async def cloud_side():
        first = await cloud_channel.recv()
        cfg, ids, _ = parse_start(first)
        session = CloudSession(cloud_channel, target_lm, cfg, ids)
        ctx, release = session.verifier.ctx, session.verifier.ctx.release

        def check_then_release():  # the cloud frees its KV when the device ends the session
            session.consistent_at_end = consistent(ctx, target_lm)
            release()

        ctx.release = check_then_release
        await session.run()
        return session

    cloud_task = asyncio.create_task(cloud_side())
    device = DeviceSession(device_channel, draft_lm, prompt, config)
    report = await device.run()
    cloud = await asyncio.wait_for(cloud_task, 30)
    await device_channel.close()
    await cloud_channel.close()
    return report, device, cloud


def test_async_run_leaves_both_caches_consistent(tiny_lm, tiny_target, prompt_ids):
    config = SpecConfig(pipeline="async", temperature=1.0, seed=5, max_new_tokens=30)
    link = LinkConfig(delay_ms=4.0, jitter_ms=3.0, seed=2)
    report, device, cloud = asyncio.run(
        run_sessions(tiny_lm, tiny_target, prompt_ids, config, link)
    )
    assert any(v.rejected for v in report.verdicts)
    assert cloud.stats["stale_requests"] > 0  # blocks were in flight when rejections came
    assert device.drafter.committed[: cloud.verifier.frontier] == cloud.verifier.committed
    assert_consistent(device.drafter)
    assert cloud.consistent_at_end and cloud.verifier.ctx.state is None


def test_a_rejection_preempts_the_draft_step_in_flight():
    draft, target = fake_pair(8)
    draft.step_delay_s = 0.03  # drafting is slow, verifying is fast: verdicts land mid-step
    config = SpecConfig(pipeline="async", temperature=0.0, max_new_tokens=30, stop_at_eos=False)
    prompt = [1, 2, 3]
    report, _ = asyncio.run(
        run_pair(device_lm=draft, cloud_lm=target, prompt_ids=prompt, config=config)
    )
    assert report.tokens == fake_greedy(target, prompt, 30)
    assert report.cancelled_steps > 0


def test_a_device_interrupt_cancels_the_cloud_verification():
    draft, target = fake_pair(8)
    target.step_delay_s = 0.25  # a 4-token verification takes a second
    config = SpecConfig(pipeline="async", temperature=0.0, max_new_tokens=20, stop_at_eos=False)
    prompt = [1, 2, 3]

    async def main():
        device_channel, cloud_channel = memory_pair()
        await device_channel.send(wire.start_message("spec", config.to_json(), prompt))
        first = await cloud_channel.recv()
        cfg, ids, _ = parse_start(first)
        session = CloudSession(cloud_channel, target, cfg, ids)
        task = asyncio.create_task(session.run())
        drafter, _ = make_sides(draft, draft, prompt, config)
        for _ in range(4):
            drafter.draft_next()
        await device_channel.send(wire.request_message(1, drafter.take_chunk(), config.codec))
        await asyncio.sleep(0.6)  # the cloud is inside the forward pass
        await device_channel.send(wire.interrupt_message(1, 0, "user cancelled"))
        await asyncio.sleep(0.2)
        verifier = session.verifier
        assert session.stats["cancelled_verifications"] == 1
        assert verifier.frontier == 0 and verifier.epoch == 1
        assert verifier.ctx.ids == prompt and verifier.ctx.state.ids == prompt
        # the session goes on in the new epoch
        drafter.drafts.clear(), setattr(drafter, "sent", 0), setattr(drafter, "epoch", 1)
        drafter.ctx.truncate(0)
        drafter.draft_next()
        await device_channel.send(wire.request_message(2, drafter.take_chunk(), config.codec))
        reply = await asyncio.wait_for(device_channel.recv(), 5)
        while not isinstance(reply, VerifyResult):
            reply = await asyncio.wait_for(device_channel.recv(), 5)
        assert wire.parse_result(reply)["epoch"] == 1
        await device_channel.send(control.end())
        await asyncio.wait_for(task, 5)
        await device_channel.close()
        await cloud_channel.close()

    asyncio.run(main())


@pytest.mark.parametrize("fast_verify,first_size", [(True, 1), (False, 4)])
def test_fast_verification_sends_a_prefix_first(fast_verify, first_size):
    draft, target = fake_pair(8)
    draft.step_delay_s = 0.005
    config = SpecConfig(
        pipeline="async", fast_verify=fast_verify, temperature=0.0, max_new_tokens=16
    )
    report, _ = asyncio.run(
        run_pair(device_lm=draft, cloud_lm=target, prompt_ids=[1, 2, 3], config=config)
    )
    assert report.chunk_sizes[0] == first_size
    assert report.tokens == fake_greedy(target, [1, 2, 3], 16)


def test_latency_aware_truncation_sends_a_partial_block():
    draft, target = fake_pair(8, mix=1.0)  # the draft is the target: every draft accepted
    draft.step_delay_s = 0.01
    prompt = [1, 2, 3]
    draft.slow_positions = {len(prompt) + 6: 0.4}  # one draft step stalls (device hiccup)
    config = SpecConfig(
        pipeline="async", fast_verify=False, truncate_factor=2.0, temperature=0.0,
        max_new_tokens=16,
    )  # fmt: skip
    report, _ = asyncio.run(
        run_pair(device_lm=draft, cloud_lm=target, prompt_ids=prompt, config=config)
    )
    assert report.truncated_chunks >= 1
    assert any(0 < size < 4 for size in report.chunk_sizes[:-1])
    assert report.tokens == fake_greedy(target, prompt, 16)


def test_bit_budget_decides_the_block_length():
    draft, target = fake_pair(8)
    # k-sqs with k=3, ell=12 over 8 tokens: ceil(log2 C(8,3)) + ceil(log2 C(14,2)) = 6 + 7 bits
    config = SpecConfig(
        codec="k-sqs", codec_params={"k": 3, "ell": 12}, draft_len=10, bit_budget=30,
        temperature=1.0, max_new_tokens=20, stop_at_eos=False,
    )  # fmt: skip
    report, _ = asyncio.run(
        run_pair(device_lm=draft, cloud_lm=target, prompt_ids=[1, 2, 3], config=config)
    )
    assert set(report.chunk_sizes[:-1]) == {2}  # 2 x 13 bits fit in 30, 3 x 13 do not
    assert report.summary()["payload_bits_per_draft"] == 16  # 13 bits -> 2 bytes each


def test_async_output_does_not_depend_on_timing(tiny_lm, tiny_target, prompt_ids):
    """Every draw is seeded by its position, so links and chunking change nothing."""
    runs = []
    for link, fast in ((None, True), (LinkConfig(delay_ms=15, jitter_ms=10, seed=3), False)):
        config = SpecConfig(
            pipeline="async", fast_verify=fast, temperature=1.0, seed=9, max_new_tokens=24,
            stop_at_eos=False,
        )  # fmt: skip
        report, _ = asyncio.run(
            run_pair(
                device_lm=tiny_lm,
                cloud_lm=tiny_target,
                prompt_ids=prompt_ids,
                config=config,
                link=link,
            )  # fmt: skip
        )
        runs.append(report)
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].chunk_sizes != runs[1].chunk_sizes  # the chunking did differ
    sync = lockstep(tiny_lm, tiny_target, prompt_ids, SpecConfig(temperature=1.0, seed=9))
    assert sync[0] == runs[0].tokens[0]  # the first token is the same draw in every pipeline


def test_a_bad_start_message_is_refused_with_one_line():
    draft, target = fake_pair(8)

    async def main():
        device_channel, cloud_channel = memory_pair()
        task = asyncio.create_task(serve_session(cloud_channel, target))
        await device_channel.send(wire.start_message("spec", {"codec": "nope"}, (1, 2)))
        reply = await asyncio.wait_for(device_channel.recv(), 5)
        assert await task is None
        return reply

    reply = asyncio.run(main())
    assert reply.code == "spec" and "codec must be one of" in reply.message
    assert "\n" not in reply.message


def test_a_cloud_error_reaches_the_device_as_a_tandem_error():
    draft, target = fake_pair(8)
    config = SpecConfig(max_new_tokens=8)

    async def main():
        device_channel, cloud_channel = memory_pair()
        task = asyncio.create_task(serve_session(cloud_channel, target))
        try:
            await DeviceSession(device_channel, draft, [], config).run()
        finally:
            task.cancel()

    with pytest.raises((TandemError, ValueError)):
        asyncio.run(main())


def test_run_pair_raises_a_cloud_crash_instead_of_waiting_forever(monkeypatch):
    async def crash(self, requests):
        raise RuntimeError("verifier bug")

    monkeypatch.setattr(CloudSession, "_verify_all", crash)
    draft, target = fake_pair(8)
    config = SpecConfig(pipeline="async", max_new_tokens=8)

    async def main():
        async with asyncio.timeout(20):
            await run_pair(device_lm=draft, cloud_lm=target, prompt_ids=[1, 2], config=config)

    with pytest.raises(RuntimeError, match="verifier bug"):
        asyncio.run(main())


def test_async_is_not_slower_than_stop_and_wait_when_drafts_are_poor():
    """PicoSpec's robustness bound: with almost every draft rejected, the pipeline degrades to
    stop-and-wait (timed with sleeping fake models, so the CPU load does not matter)."""
    times = {}
    for pipeline in ("sync", "async"):
        draft, target = fake_pair(8, mix=0.0)  # independent laws: ~1/8 greedy agreement
        draft.step_delay_s, target.step_delay_s = 0.004, 0.006
        config = SpecConfig(
            pipeline=pipeline, codec="separate", temperature=0.0, max_new_tokens=12,
            stop_at_eos=False,
        )  # fmt: skip
        link = LinkConfig(delay_ms=10.0)
        report, _ = asyncio.run(
            run_pair(
                device_lm=draft, cloud_lm=target, prompt_ids=[1, 2, 3], config=config, link=link
            )
        )
        assert report.summary()["acceptance_rate"] < 0.5
        times[pipeline] = report.total_s
    assert times["async"] < 1.25 * times["sync"], times
