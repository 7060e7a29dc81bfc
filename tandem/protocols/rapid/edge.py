"""RAPID split over a network: the RAG drafter on the device (it holds C^S), the long-context
target in the cloud (it holds C). Written against `tandem.transport.Channel`.

Theory of operation (one session; a generation opens with the transport's Start / Ready,
its rounds are VerifyRequest / VerifyResult):

    device                                           cloud
    open: Start(mode "rapid",                  ->    target prompt = C + question; prefill
          body {question, settings})                 (device prefills C^S meanwhile)
                                               <-    Ready(body {prompt_tokens})
    round k: draft gamma tokens from q         ->    decode the payloads into q, score the
          VerifyRequest(seq k, position,             block in one forward pass, verify
          tokens, codec, one payload per token,      (rule Augmented: eta, mode, tail)
          arrays {bonus: the bonus row's payload}
          in exact mode)
                                               <-    VerifyResult(seq k, num_accepted,
                                                                  next_token)
    Bye (channel.close())                      ->    session ends

`settings` holds RapidConfig's fields and the codec's name and parameters. A channel may carry
several generations: each opens with its own Start. Drafts are sampled from the codec's
*transmitted* law (tandem.codecs), which is exactly what the cloud decodes, so verification
is exact. Both sides draw with the one position scheme (the device's drafts
(seed, "draft", p), the cloud's tests (seed, "verify", p)), as the local engine does: with
the same codec the split run emits the same tokens as `engine.rapid`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import numpy as np
import torch

from tandem.codecs import Codec, make_codec
from tandem.errors import TandemError
from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken, Rounds, Target
from tandem.protocols.rapid.config import RapidConfig
from tandem.protocols.rapid.drafter import ModelDrafter
from tandem.protocols.rapid.engine import RapidResult, eos_id, make_rule, make_target, result_of
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.states import Prefilled
from tandem.transport import Channel, Error, Ready, Start, VerifyRequest, VerifyResult, control

DEFAULT_CODEC = ("top-k", {"k": 64})
MODE = "rapid"  # Start.mode


async def _expect(channel: Channel, kind: type, seq: int | None = None):
    """The cloud's next message, which must be a `kind` (of round `seq`, for a verdict)."""
    reply = await channel.recv()
    if isinstance(reply, Error):
        raise TandemError(f"cloud refused the RAPID session: {reply.message}")
    if not isinstance(reply, kind) or (seq is not None and reply.seq != seq):
        raise TandemError(f"unexpected reply from the cloud: {type(reply).__name__}")
    return reply


async def device_generate(
    channel: Channel,
    drafter_lm: CausalLM,
    retrieved: str,
    question: str,
    config: RapidConfig,
    *,
    codec: tuple[str, dict] = DEFAULT_CODEC,
    on_token: OnToken | None = None,
) -> RapidResult:
    """The device side of one RAPID generation; returns the tokens and the timings.
    `on_token` gets every output token as soon as its round is verified (a lost cloud then
    leaves exactly those committed)."""
    name, params = codec
    sender = make_codec(name, **params)
    settings = {**dataclasses.asdict(config), "codec": name, "codec_params": params}
    start = time.perf_counter()
    sent0, received0 = channel.bytes_sent, channel.bytes_received
    await channel.send(control.start(MODE, {"question": question, "settings": settings}))
    ids = drafter_prompt(drafter_lm.tokenizer, retrieved, question)
    drafter_side = await asyncio.to_thread(Prefilled, drafter_lm, ids)
    await _expect(channel, Ready)
    prefill_s = time.perf_counter() - start
    drafter = ModelDrafter(
        drafter_lm,
        drafter_side.fresh(),
        seed=config.seed,
        temperature=config.temperature,
        bonus_row=config.draft_bonus_row,
        codec=sender,
    )
    rounds = Rounds(
        gamma=config.gamma, max_new_tokens=config.max_new_tokens, eos=eos_id(drafter_lm, config)
    )
    decode_start = time.perf_counter()
    while not rounds.done:
        block, position = rounds.block(), len(rounds.tokens)
        t0 = time.perf_counter()
        drafts, draft_probs = await asyncio.to_thread(drafter.propose, block, position)
        payloads = [sender.encode(row) for row in draft_probs]
        t1 = time.perf_counter()
        seq = len(rounds.per_round) + 1
        bonus = {"bonus": np.frombuffer(payloads[-1], np.uint8).copy()} if drafter.bonus_row else {}
        await channel.send(
            VerifyRequest(
                seq=seq,
                position=position,
                tokens=tuple(drafts),
                codec=name,
                distributions=tuple(payloads[:block]),
                arrays=bonus,
            )
        )
        reply = await _expect(channel, VerifyResult, seq)
        t2 = time.perf_counter()
        drafter.accept(reply.num_accepted, reply.next_token)
        rounds.draft_s += t1 - t0
        rounds.verify_s += t2 - t1  # seen from the device: uplink + verification + downlink
        for token in rounds.record(drafts, reply.num_accepted, reply.next_token):
            if on_token is not None:
                on_token(token)
    return result_of(
        rounds,
        drafter_lm.tokenizer,
        prefill_s=prefill_s,
        decode_s=time.perf_counter() - decode_start,
        extra={
            "uplink_bytes": channel.bytes_sent - sent0,
            "downlink_bytes": channel.bytes_received - received0,
            "codec": name,
        },
    )


def _config_from(settings: dict) -> tuple[RapidConfig, Codec]:
    fields = {f.name for f in dataclasses.fields(RapidConfig)}
    config = RapidConfig(**{k: v for k, v in settings.items() if k in fields})
    return config, make_codec(settings["codec"], **settings.get("codec_params", {}))


async def cloud_session(
    channel: Channel, target_lm: CausalLM, context: str, *, first: Start | None = None
) -> dict:
    """The cloud side of RAPID sessions on one channel: the target reads `context` in full.
    `first`: a message already read from the channel (a multi-mode server's dispatcher reads
    it). Returns the session's counts (generations opened, verify rounds, drafts verified and
    accepted, tokens emitted) when the device closes the channel."""
    verifier: Target | None = None
    codec: Codec | None = None
    stats = {"generations": 0, "rounds": 0, "drafts_verified": 0, "drafts_accepted": 0, "tokens": 0}

    async def handle(msg: Start | VerifyRequest) -> None:
        nonlocal verifier, codec
        if isinstance(msg, Start):  # open (or re-open) a generation
            try:
                if msg.mode != MODE:
                    raise ValueError(f"mode {msg.mode!r} is not {MODE}")
                body = control.body(msg)
                config, codec = _config_from(dict(body["settings"]))
                question = str(body["question"])
            except (KeyError, ValueError, TypeError, TandemError) as exc:
                await channel.send(Error(code="rapid-open", message=str(exc).splitlines()[0]))
                return
            ids = target_prompt(target_lm.tokenizer, context, question)
            target_side = await asyncio.to_thread(Prefilled, target_lm, ids)
            verifier = make_target(target_lm, target_side.fresh(), config, make_rule(config))
            stats["generations"] += 1
            await channel.send(control.ready({"prompt_tokens": len(ids)}))
            return
        if verifier is None or codec is None or msg.codec != codec.name:
            await channel.send(Error(code="rapid-state", message="verify before open, or codec"))
            return
        vocab = target_lm.vocab_size
        payloads = list(msg.distributions)
        if "bonus" in msg.arrays:  # the drafter's law at the bonus position (exact mode)
            payloads.append(msg.arrays["bonus"].astype(np.uint8).tobytes())
        draft_probs = torch.stack([codec.decode(p, vocab) for p in payloads])
        verdict = await asyncio.to_thread(
            verifier.verify, msg.position, list(msg.tokens), draft_probs
        )
        stats["rounds"] += 1
        stats["drafts_verified"] += len(msg.tokens)
        stats["drafts_accepted"] += verdict.num_accepted
        stats["tokens"] += verdict.num_accepted + 1
        await channel.send(
            VerifyResult(
                seq=msg.seq,
                position=msg.position,
                num_accepted=verdict.num_accepted,
                next_token=verdict.next_token,
            )
        )

    if first is not None:
        await handle(first)
    async for msg in channel:
        if isinstance(msg, (Start, VerifyRequest)):
            await handle(msg)
    return stats


def cloud_handler(target_lm: CausalLM, context: str) -> Callable[[Channel], Awaitable[None]]:
    """A `tandem.transport.serve` handler serving RAPID sessions over one long context."""

    async def handler(channel: Channel) -> None:
        await cloud_session(channel, target_lm, context)

    return handler
