"""The cloud side of DRAGON's baselines, and a cloud that serves DRAGON and all of them.

`serve_baseline(channel, first, ...)` answers one baseline session whose start message is
`first` (see `device.py` for what each method does); `serve_any(channel, ...)` reads the first
message and dispatches: a DRAGON start goes to `tandem.protocols.dragon.serve_cloud`, a
baseline start here. `cloud_main` is the process entry the benchmarks start (inside the
cloud network namespace):

    python -m tandem.baselines.dragon.cloud --corpus INDEX --model qwen2.5-coder-0.5b \
        --listen 127.0.0.1:7400 --ready-file /tmp/cloud.json --threads 1

Only DRCG's handler sends documents (texts or their KV); the others send tokens and laws.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

from tandem.codecs import make_codec
from tandem.errors import TandemError
from tandem.protocols.dragon import serve_cloud, wire
from tandem.protocols.dragon.config import CLOUD, DragonConfig
from tandem.protocols.dragon.knowledge import Knowledge, build_decoder
from tandem.transport import ChannelClosed, TargetToken, TransportError, control
from tandem.transport import loop as event_loop

from .context import block_state, context_layout, generate, prefill_context, state_to_bytes
from .device import NETWORK_METHODS, _generate_side, _side_step, recv_app

KV_PART_BYTES = 2**20  # DRCG/KV parts (the transport caps an array dimension at 2 Mi)
DRAIN_S = 30.0


async def serve_any(channel, *, lm, knowledge: Knowledge, profile=None) -> dict | None:
    """One session of DRAGON or of any baseline, chosen by the device's first message."""
    try:
        first = await channel.recv()
    except ChannelClosed:
        return None
    if control.start_mode(first) == wire.MODE:
        report = await serve_cloud(
            channel, lm=lm, knowledge=knowledge, profile=profile, first=first
        )
        return None if report is None else {"method": "dragon", **report.summary()}
    return await serve_baseline(channel, first, lm=lm, knowledge=knowledge)


async def serve_baseline(channel, first, *, lm, knowledge: Knowledge) -> dict | None:
    """The cloud side of one baseline session (`first` = its start message)."""
    try:
        method = control.start_mode(first)
        if method is None:
            raise ValueError("expected a dragon start or baseline start message")
        body = control.body(first)
        question = str(body["question"])
        config = DragonConfig.from_json(body["config"])
        if method not in NETWORK_METHODS:
            raise ValueError(f"unknown baseline {method!r}")
    except (KeyError, TypeError, ValueError, TandemError) as exc:
        with contextlib.suppress(TransportError):
            await channel.send(wire.error_message(f"bad start message: {exc}"))
        return None
    handler = {
        "crcg-cloud": _crcg_cloud,
        "drcg-text": _drcg_text,
        "drcg-kv": _drcg_kv,
        "drdg-tw": _drdg_tw,
        "drdg-sw": _drdg_sw,
    }[method]
    began = time.perf_counter()
    try:
        stats = await handler(channel, lm=lm, knowledge=knowledge, question=question, config=config)
        with contextlib.suppress(TimeoutError):  # until the device says Bye
            await asyncio.wait_for(_drain(channel), DRAIN_S)
    except (ChannelClosed, TransportError):
        return None
    return {"method": method, "wall_s": time.perf_counter() - began, **stats}


async def _drain(channel) -> None:
    with contextlib.suppress(ChannelClosed, TransportError):
        while True:
            await channel.recv()


def _docs(knowledge: Knowledge, question: str, k: int) -> list[str]:
    return [d.text for d in knowledge.retrieve(question, k)]


async def _crcg_cloud(channel, *, lm, knowledge, question, config) -> dict:
    texts = await asyncio.to_thread(_docs, knowledge, question, config.docs_per_side)
    layout = context_layout(lm.tokenizer, texts, [], question)
    state = await asyncio.to_thread(prefill_context, lm, layout, knowledge.kv_store)
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def produce() -> list[int]:  # decode thread; the event loop sends in order
        try:
            return generate(
                lm, state, config, on_token=lambda t: loop.call_soon_threadsafe(queue.put_nowait, t)
            )
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    producer = asyncio.create_task(asyncio.to_thread(produce))
    position = 0
    while (token := await queue.get()) is not None:
        await channel.send(TargetToken(seq=position, position=position, token=token))
        position += 1
    tokens = await producer
    return {"tokens": len(tokens), "context_tokens": len(layout.ids)}


async def _drcg_text(channel, *, lm, knowledge, question, config) -> dict:
    texts = await asyncio.to_thread(_docs, knowledge, question, config.docs_per_side)
    body = {"texts": texts, "docs": len(texts)}
    await channel.send(wire.control_message(wire.BASE_DOCS, 0, body))
    return {"docs": len(texts), "bytes": sum(len(t.encode()) for t in texts)}


def _kv_payload(lm, knowledge: Knowledge, question: str, k: int) -> tuple[bytes, int, int]:
    """(safetensors bytes of the cloud documents' block, block tokens, docs)."""
    texts = _docs(knowledge, question, k)
    block = context_layout(lm.tokenizer, texts, ["-"], question).block
    store = knowledge.kv_store
    if store is not None:
        store.put(block)  # precomputed once per block (a hit afterwards), like DRAGON's docs
        return store.path(block).read_bytes(), len(block), len(texts)
    return state_to_bytes(lm, block_state(lm, block)), len(block), len(texts)


def kv_messages(data: bytes, **meta) -> list:
    """DRCG/KV's state bytes as control frames of at most KV_PART_BYTES each."""
    parts = [data[i : i + KV_PART_BYTES] for i in range(0, len(data), KV_PART_BYTES)] or [b""]
    return [
        wire.blob_message(
            wire.BASE_KV,
            {"part": n, "last": n == len(parts) - 1, "nbytes": len(data), **meta},
            part,
        )
        for n, part in enumerate(parts)
    ]


async def _drcg_kv(channel, *, lm, knowledge, question, config) -> dict:
    began = time.perf_counter()
    data, block_tokens, docs = await asyncio.to_thread(
        _kv_payload, lm, knowledge, question, config.docs_per_side
    )
    ready_s = time.perf_counter() - began
    for msg in kv_messages(data, block_tokens=block_tokens, docs=docs):
        await channel.send(msg)
    return {"kv_bytes": len(data), "block_tokens": block_tokens, "kv_ready_s": ready_s}


async def _drdg_tw(channel, *, lm, knowledge, question, config) -> dict:
    codec = make_codec(config.codec, **config.codec_params)
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    decoder, _ = await asyncio.to_thread(build_decoder, lm, knowledge, question, config)
    await asyncio.to_thread(decoder.prefill)
    tokens: list[int] = []
    decode_s = []
    while True:
        draft, seconds = await asyncio.to_thread(
            _side_step, decoder, list(tokens), codec, config, CLOUD
        )
        decode_s.append(seconds)
        await channel.send(wire.draft_message(0, draft, codec.name))
        while not isinstance(msg := await recv_app(channel), TargetToken):
            pass
        if msg.position != len(tokens):
            raise TandemError(f"drdg-tw: target for {msg.position}, expected {len(tokens)}")
        tokens.append(msg.token)
        if len(tokens) >= config.max_new_tokens or (eos is not None and msg.token == eos):
            return {"tokens": len(tokens), "cloud_decode_s": decode_s}


async def _drdg_sw(channel, *, lm, knowledge, question, config) -> dict:
    codec = make_codec(config.codec, **config.codec_params)
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    decoder, _ = await asyncio.to_thread(build_decoder, lm, knowledge, question, config)
    await asyncio.to_thread(decoder.prefill)
    logweight = decoder.law().logweight
    tokens, payloads, logprob = await asyncio.to_thread(
        _generate_side, decoder, codec, config, CLOUD, eos
    )
    msg = wire.sequence_message(tokens, payloads, codec_name=codec.name, logweight=logweight)
    await channel.send(msg)
    return {"tokens": len(tokens), "logprob": logprob, "sequence_bytes": sum(map(len, payloads))}


def cloud_main(argv: list[str] | None = None) -> None:
    """A cloud process serving DRAGON and every baseline (used by the DRAGON benchmarks)."""
    from tandem.protocols.dragon.setup import load_side, set_threads, transport_config
    from tandem.testbed.cpus import machine_state
    from tandem.testbed.proxy import parse_hostport
    from tandem.transport import serve

    parser = argparse.ArgumentParser(prog="python -m tandem.baselines.dragon.cloud")
    parser.add_argument("--corpus", required=True, help="index folder (or corpus folder)")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    async def main() -> None:
        host, port = parse_hostport(args.listen)
        setup = load_side(corpus=args.corpus, model=args.model, docs=args.docs, progress=False)

        async def handler(channel) -> None:
            await serve_any(channel, lm=setup.lm, knowledge=setup.knowledge, profile=setup.profile)

        config = transport_config(setup.lm, role="cloud")
        server = await serve(handler, host, port, config=config)
        partial = args.ready_file.with_name(args.ready_file.name + ".partial")
        ready = {"host": server.host, "port": server.port, "machine": machine_state(setup.lm)}
        partial.write_text(json.dumps(ready))
        partial.replace(args.ready_file)
        try:
            await asyncio.Event().wait()  # until SIGTERM
        finally:
            await server.close()

    try:
        set_threads(args.threads)
        event_loop.run(main())
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cloud_main()
