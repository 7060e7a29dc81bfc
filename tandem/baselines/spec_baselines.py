"""Baselines for edge-cloud speculative decoding (PicoSpec Table 1, SQS-SD's references).

- cloud autoregressive ("ar"): the device sends the prompt, the cloud generates every token
  with the target model and streams each one back as a TargetToken (TTFT pays one RTT, the
  rest is the cloud's decode speed).
- device only ("local"): the draft model alone, no network (`tandem.protocols.local`).
- stop-and-wait SD: `tandem.protocols.spec` with pipeline "sync" (`run_stop_and_wait`).

Every one returns a `SpecReport`, so benchmarks tabulate them side by side. Sampling uses
the same position generators as the speculative modes (purpose "verify"), so the cloud's
autoregressive output is the same draw whichever side asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tandem.errors import ModeNotServed, TandemError
from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken, decode_steps
from tandem.protocols.spec import wire
from tandem.protocols.spec.cloud import parse_start
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.context import LMContext
from tandem.protocols.spec.device import run_device
from tandem.protocols.spec.stats import SpecReport
from tandem.transport import ChannelClosed, End, Error, Stats, TargetToken, TransportError, control


def _steps(lm: CausalLM, ctx: LMContext, config: SpecConfig, eos: int | None):
    """The one decoding loop (tandem.protocols.decoding) with no drafter, from a prefilled
    context, drawing with the verifier's position seeds, so cloud AR emits what every exact
    mode emits."""
    return decode_steps(
        lm,
        ctx.state,
        seed=config.seed,
        **config.sampling(),
        max_new_tokens=config.max_new_tokens,
        eos=eos,
    )


async def serve_cloud_ar(channel, lm: CausalLM, *, first=None) -> dict | None:
    """Cloud side of the autoregressive baseline: generate and stream every token."""
    try:
        msg = first if first is not None else await channel.recv()
        config, prompt, mode = parse_start(msg)
        if mode != "ar":
            raise ValueError(f"mode {mode!r} is not the autoregressive baseline")
    except ChannelClosed:
        return None
    except (ValueError, TypeError, TandemError) as exc:
        with contextlib.suppress(TransportError):
            await channel.send(wire.error_message(f"bad start message: {exc}"))
        return None
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    ctx = LMContext(lm, prompt)
    start = time.perf_counter()
    await asyncio.to_thread(ctx.prefill)
    stats = {"model": getattr(lm, "name", ""), "prefill_s": time.perf_counter() - start}
    decode_start = time.perf_counter()
    steps = _steps(lm, ctx, config, eos)
    position = 0
    while (token := await asyncio.to_thread(next, steps, None)) is not None:
        await channel.send(TargetToken(seq=position, position=position, token=token))
        position += 1
    stats["decode_s"] = time.perf_counter() - decode_start
    stats["tokens"] = position
    with contextlib.suppress(ChannelClosed, TransportError):
        while not isinstance(await channel.recv(), End):
            pass
        steps.close()  # the loop holds the state: free the KV before the device hears we are done
        ctx.release()
        await channel.send(control.stats(stats))
    return stats


async def run_cloud_ar(
    channel,
    tokenizer,
    prompt_ids: list[int],
    config: SpecConfig,
    *,
    on_token: OnToken | None = None,
    close: bool = True,
) -> SpecReport:
    """Device side of the autoregressive baseline: send the prompt, collect the stream."""
    report = SpecReport(
        mode="ar", config=config.to_json(), tokens=[], text="", total_s=0.0, token_times=[]
    )
    eos = tokenizer.eos_token_id if config.stop_at_eos else None
    up0, down0 = channel.bytes_sent, channel.bytes_received
    start = time.perf_counter()
    try:
        await channel.send(wire.start_message("ar", config.to_json(), prompt_ids))
        while len(report.tokens) < config.max_new_tokens and eos not in report.tokens:
            msg = await channel.recv()
            if isinstance(msg, Error):
                kind = ModeNotServed if msg.code == "mode" else TandemError
                raise kind(f"cloud error: {msg.message}")
            if isinstance(msg, TargetToken):
                report.tokens.append(msg.token)
                report.token_times.append(time.perf_counter() - start)
                if on_token is not None:
                    on_token(msg.token)
        report.total_s = time.perf_counter() - start
        await channel.send(control.end(tuple(report.tokens)))
        with contextlib.suppress(asyncio.TimeoutError):
            while True:
                msg = await asyncio.wait_for(channel.recv(), 10.0)
                if isinstance(msg, Stats):
                    report.cloud = control.body(msg)
                    break
    except (ChannelClosed, TransportError) as exc:
        raise TandemError(f"connection to the cloud lost: {exc}") from None
    finally:
        report.uplink_bytes = channel.bytes_sent - up0
        report.downlink_bytes = channel.bytes_received - down0
        if close:
            with contextlib.suppress(TransportError):
                await channel.close("ar done")
    report.text = tokenizer.decode(report.tokens)
    return report


def run_device_only(
    lm: CausalLM, prompt_ids: list[int], config: SpecConfig, *, on_token: OnToken | None = None
) -> SpecReport:
    """The draft model alone on the device (no network)."""
    report = SpecReport(
        mode="local", config=config.to_json(), tokens=[], text="", total_s=0.0, token_times=[]
    )
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    ctx = LMContext(lm, prompt_ids)
    start = time.perf_counter()
    ctx.prefill()
    report.device_prefill_s = time.perf_counter() - start
    for token in _steps(lm, ctx, config, eos):
        report.tokens.append(token)
        report.token_times.append(time.perf_counter() - start)
        if on_token is not None:
            on_token(token)
    report.total_s = time.perf_counter() - start
    report.text = lm.tokenizer.decode(report.tokens)
    return report


async def run_stop_and_wait(
    channel, lm: CausalLM, prompt_ids: list[int], config: SpecConfig, **kwargs
) -> SpecReport:
    """Vanilla edge-cloud SD: the sync pipeline (draft, send, wait)."""
    sync = SpecConfig(**{**config.to_json(), "pipeline": "sync"})
    return await run_device(channel, lm, prompt_ids, sync, **kwargs)
