"""The device side of DRAGON's baselines (paper Sec. 7.2); the cloud side is `cloud.py`.

Methods (`METHODS`), all with DRAGON's models, corpora, question and `DragonConfig`:
- `crcg-device`: the device's own top-k documents concatenated, decoded alone (no network).
- `crcg-cloud`: the device sends the question; the cloud concatenates ITS top-k documents,
  decodes alone and streams each token back (a TargetToken per token).
- `drcg-text`: the cloud sends its top-k document texts; the device prefills cloud + own
  documents in one context and decodes alone. `drcg-kv`: the cloud sends the KV cache of its
  documents' block instead (safetensors bytes, in parts) and the device only decodes its own
  documents and the question on top. Both make documents cross the network (the privacy
  cost DRAGON avoids); both output the same tokens.
- `drdg-tw`: token-wise synchronised output aggregation: every position, the cloud sends its
  draft (token + codec payload of its side law), the device runs Algorithm 1 and sends the
  target token back; the cloud decodes it only then (stop-and-wait, one RTT per token).
- `drdg-sw`: sequence-wise: both sides generate a whole answer from their own side law; the
  cloud then sends its answer with the payloads of all its laws at once, and the device keeps
  the answer with the larger sequence weight `log eta_s + sum_t log p~_s(y_t | y_<t)`.

Words: *token times* count from the start of the method on the device; *decode start* is
when the device could start decoding (its own prompt prefilled); *transfer bytes* are the
document texts or KV bytes DRCG moves (0 for the others).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from tandem.codecs import make_codec
from tandem.errors import TandemError
from tandem.protocols.decoding import OnToken
from tandem.protocols.dragon import wire
from tandem.protocols.dragon.aggregator import aggregate_step
from tandem.protocols.dragon.config import CLOUD, DEVICE, DragonConfig
from tandem.protocols.dragon.knowledge import Knowledge, build_decoder
from tandem.protocols.dragon.queues import make_draft
from tandem.protocols.report import Headline, from_times
from tandem.transport import (
    ChannelClosed,
    DraftTokens,
    Error,
    Start,
    TargetToken,
    TransportError,
    control,
)

from .context import context_layout, generate, prefill_context, state_from_bytes, trailing_ids

METHODS = ("crcg-device", "crcg-cloud", "drcg-text", "drcg-kv", "drdg-tw", "drdg-sw")
NETWORK_METHODS = METHODS[1:]


@dataclass
class BaselineReport:
    method: str
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    token_times: list[float] = field(default_factory=list)  # s since the method started
    decode_start_s: float = 0.0  # the device's own prompt is ready
    transfer_bytes: int = 0  # documents (text or KV) received over the network
    transfer_s: float = 0.0  # first to last byte of those documents
    bytes_sent: int = 0
    bytes_received: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def per_token_s(self) -> float | None:
        """Mean gap between tokens; for drdg-sw (all tokens arrive at once) the decoding time
        from `decode_start_s` to the chosen answer, per token (see `headline`)."""
        head = self.headline()
        return head.decode_s / head.decode_tokens if head.decode_tokens else None

    def headline(self) -> Headline:
        """The device's view (a baseline's report is the device's; the finish reason is not
        recorded); DRDG/SW's answer arrives whole, so its decode time runs from the device's
        own prompt being ready."""
        if self.method == "drdg-sw" and self.token_times:
            tokens, decode = len(self.tokens), self.token_times[-1] - self.decode_start_s
            return Headline(
                mode=self.method,
                tokens=tokens,
                ttft_s=self.token_times[0],
                decode_tokens=tokens,
                decode_s=decode,
                finish_reason="",
                uplink_bytes=self.bytes_sent,
                downlink_bytes=self.bytes_received,
            )
        return from_times(
            self.method,
            self.tokens,
            self.token_times,
            "",
            uplink_bytes=self.bytes_sent,
            downlink_bytes=self.bytes_received,
        )

    def summary(self) -> dict:
        return {
            "method": self.method,
            "new_tokens": len(self.tokens),
            "ttft_s": self.ttft_s,
            "per_token_s": self.per_token_s,
            "decode_start_s": self.decode_start_s,
            "transfer_bytes": self.transfer_bytes,
            "transfer_s": self.transfer_s,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            **self.extra,
        }


class _Clock:
    def __init__(self, report: BaselineReport, on_token: OnToken | None):
        self.began = time.perf_counter()
        self.report, self.on_token = report, on_token

    def now(self) -> float:
        return time.perf_counter() - self.began

    def token(self, token: int, at: float | None = None) -> None:
        self.report.tokens.append(token)
        self.report.token_times.append(self.now() if at is None else at)
        if self.on_token is not None:
            self.on_token(token)


def start_message(method: str, config: DragonConfig, question: str) -> Start:
    """A baseline session's Start: its mode is the method's name (e.g. "drdg-tw")."""
    return control.start(method, {"config": config.to_json(), "question": question})


async def recv_app(channel):
    """The next message that is not padding; a peer Error becomes a TandemError."""
    while True:
        msg = await channel.recv()
        if isinstance(msg, Error):
            raise TandemError(f"cloud error: {msg.message}")
        if not wire.is_pad(msg):
            return msg


def _retrieve(knowledge: Knowledge, question: str, k: int) -> list[str]:
    return [d.text for d in knowledge.retrieve(question, k)]


def run_crcg_device(
    *, lm, knowledge: Knowledge, question: str, config: DragonConfig, on_token=None
) -> BaselineReport:
    """CRCG/Device: own documents concatenated, decoded here; no network."""
    report = BaselineReport(method="crcg-device")
    clock = _Clock(report, on_token)
    layout = context_layout(
        lm.tokenizer, _retrieve(knowledge, question, config.docs_per_side), [], question
    )
    state = prefill_context(lm, layout, knowledge.kv_store)
    report.decode_start_s = clock.now()
    report.extra["context_tokens"] = len(layout.ids)
    generate(lm, state, config, on_token=clock.token)
    report.text = lm.tokenizer.decode(report.tokens)
    return report


async def run_baseline_device(
    method: str,
    channel,
    *,
    lm,
    knowledge: Knowledge,
    question: str,
    config: DragonConfig,
    on_token: OnToken | None = None,
    close: bool = True,
) -> BaselineReport:
    """The device side of a networked baseline over an open channel."""
    if method not in NETWORK_METHODS:
        raise TandemError(f"unknown networked baseline {method!r} ({', '.join(NETWORK_METHODS)})")
    report = BaselineReport(method=method)
    clock = _Clock(report, on_token)
    up0, down0 = channel.bytes_sent, channel.bytes_received
    run = {"crcg-cloud": _crcg_cloud, "drcg-text": _drcg, "drcg-kv": _drcg}.get(method)
    run = run or {"drdg-tw": _drdg_tw, "drdg-sw": _drdg_sw}[method]
    try:
        await channel.send(start_message(method, config, question))
        await run(channel, clock, lm=lm, knowledge=knowledge, question=question, config=config)
    except (ChannelClosed, TransportError) as exc:
        raise TandemError(f"{method}: connection to the cloud lost: {exc}") from None
    finally:
        report.bytes_sent = channel.bytes_sent - up0
        report.bytes_received = channel.bytes_received - down0
        if close:
            with contextlib.suppress(TransportError):
                await channel.close(f"{method} done")
    report.text = lm.tokenizer.decode(report.tokens)
    return report


def _stop(tokens: list[int], config: DragonConfig, eos: int | None) -> bool:
    return len(tokens) >= config.max_new_tokens or (eos is not None and tokens[-1] == eos)


async def _crcg_cloud(channel, clock: _Clock, *, lm, config: DragonConfig, **_) -> None:
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    tokens = clock.report.tokens
    while not tokens or not _stop(tokens, config, eos):
        msg = await recv_app(channel)
        if isinstance(msg, TargetToken) and msg.position == len(tokens):
            clock.token(msg.token)


async def _drcg(channel, clock: _Clock, *, lm, knowledge, question, config, **_) -> None:
    report, k = clock.report, config.docs_per_side
    own = asyncio.create_task(asyncio.to_thread(_retrieve, knowledge, question, k))
    parts, body, first_byte = [], {}, None
    while True:  # the cloud's documents (texts, or the KV of their block in parts)
        msg = await recv_app(channel)
        kind = wire.base_kind(msg)
        first_byte = first_byte or clock.now()
        if kind == wire.BASE_DOCS:
            body = control.body(msg)
            report.transfer_bytes = sum(len(t.encode()) for t in body["texts"])
            break
        if kind == wire.BASE_KV:
            body = control.body(msg)
            parts.append(wire.message_blob(msg))
            if body["last"]:
                report.transfer_bytes = sum(map(len, parts))
                break
    report.transfer_s = clock.now() - first_byte
    own_texts = await own
    if report.method == "drcg-text":
        ids = context_layout(lm.tokenizer, body["texts"], own_texts, question).ids
        state = await asyncio.to_thread(lm.prefill, ids)
        report.extra["context_tokens"] = len(ids)
    else:
        rest = trailing_ids(lm.tokenizer, own_texts, question)
        state = await asyncio.to_thread(_extend, lm, b"".join(parts), rest)
        report.extra["context_tokens"] = int(body["block_tokens"]) + len(rest)
        report.extra["kv_block_tokens"] = int(body["block_tokens"])
    report.extra["cloud_docs"] = int(body["docs"])
    report.decode_start_s = clock.now()
    await asyncio.to_thread(generate, lm, state, config, on_token=clock.token)  # times in-thread


def _extend(lm, data: bytes, rest: list[int]):
    state = state_from_bytes(lm, data)
    lm.decode(state, rest)
    return state


def _side_step(decoder, tokens: list[int], codec, config: DragonConfig, side: str):
    """Sync a side's decoder to `tokens` and draft the next position (worker thread)."""
    began = time.perf_counter()
    decoder.sync(tokens)
    law = decoder.law()
    draft = make_draft(
        law, codec=codec, side=side, position=len(tokens), epoch=0, seed=config.seed,
        greedy=config.greedy, context=decoder.context_len,
    )  # fmt: skip
    seconds = time.perf_counter() - began
    return dataclasses.replace(draft, decode_s=seconds), seconds


async def _recv_draft(channel, *, codec, vocab_size: int, position: int):
    while True:
        msg = await recv_app(channel)
        if isinstance(msg, DraftTokens) and msg.position == position:
            return wire.parse_draft(msg, side=CLOUD, codec=codec, vocab_size=vocab_size)


async def _drdg_tw(channel, clock: _Clock, *, lm, knowledge, question, config, **_) -> None:
    codec = make_codec(config.codec, **config.codec_params)
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    decoder, _ = await asyncio.to_thread(build_decoder, lm, knowledge, question, config)
    await asyncio.to_thread(decoder.prefill)
    clock.report.decode_start_s = clock.now()
    tokens: list[int] = []
    decode_s, waits = [], []
    while not tokens or not _stop(tokens, config, eos):
        local = asyncio.create_task(
            asyncio.to_thread(_side_step, decoder, list(tokens), codec, config, DEVICE)
        )
        began = clock.now()
        remote = await _recv_draft(
            channel, codec=codec, vocab_size=lm.vocab_size, position=len(tokens)
        )
        mine, seconds = await local
        waits.append(clock.now() - began)
        decode_s.append(seconds)
        outcome = aggregate_step(mine, remote, seed=config.seed, greedy=config.greedy)
        await channel.send(wire.target_message(0, len(tokens), outcome.token, outcome.accepted))
        tokens.append(outcome.token)
        clock.token(outcome.token)
    clock.report.extra.update(device_decode_s=decode_s, step_wait_s=waits)


def _generate_side(decoder, codec, config: DragonConfig, side: str, eos):
    """A side's whole answer from its own law: tokens, payloads, log p~ of each token."""
    tokens, payloads, logprob = [], [], 0.0
    while not tokens or not _stop(tokens, config, eos):
        draft, _ = _side_step(decoder, tokens, codec, config, side)
        tokens.append(draft.token)
        payloads.append(draft.payload)
        logprob += math.log(float(draft.sent_probs[draft.token]))
    return tokens, payloads, logprob


def sequence_choice(
    logweights: dict[str, float], logprobs: dict[str, float]
) -> tuple[str, dict[str, float]]:
    """DRDG/SW's rule: the side with the larger `log eta_s + log P~_s(y_s)` (ties: device)."""
    norm = float(np.logaddexp(logweights[DEVICE], logweights[CLOUD]))
    scores = {side: logweights[side] - norm + logprobs[side] for side in (DEVICE, CLOUD)}
    return (DEVICE if scores[DEVICE] >= scores[CLOUD] else CLOUD), scores


async def _drdg_sw(channel, clock: _Clock, *, lm, knowledge, question, config, **_) -> None:
    codec = make_codec(config.codec, **config.codec_params)
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    decoder, _ = await asyncio.to_thread(build_decoder, lm, knowledge, question, config)
    await asyncio.to_thread(decoder.prefill)
    logweight = decoder.law().logweight
    clock.report.decode_start_s = clock.now()
    mine = await asyncio.to_thread(_generate_side, decoder, codec, config, DEVICE, eos)
    own_done = clock.now()
    while wire.base_kind(msg := await recv_app(channel)) != wire.BASE_SEQ:
        pass
    body = control.body(msg)
    theirs = list(msg.tokens)
    logprob = sum(
        math.log(float(codec.decode(payload, lm.vocab_size)[token]))
        for token, payload in zip(theirs, msg.distributions, strict=True)
    )
    logweights = {DEVICE: logweight, CLOUD: float(body["logweight"])}
    side, scores = sequence_choice(logweights, {DEVICE: mine[2], CLOUD: logprob})
    norm = float(np.logaddexp(logweights[DEVICE], logweights[CLOUD]))
    clock.report.extra["log_eta"] = {s: w - norm for s, w in logweights.items()}
    chosen, answered = (mine[0] if side == DEVICE else theirs), clock.now()
    for token in chosen:  # the answer is known whole, at once
        clock.token(token, at=answered)
    clock.report.extra.update(
        chosen=side, scores=scores, device_tokens=mine[0], cloud_tokens=theirs,
        device_done_s=own_done, sequence_bytes=sum(map(len, msg.distributions)),
    )  # fmt: skip
