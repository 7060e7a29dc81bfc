"""The real Qwen2.5-Coder-0.5B on both sides (short output): greedy DRAGON over TCP loopback
equals greedy decoding of the centrally computed aggregate law."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest
import torch

from tandem.protocols.dragon import DragonConfig, Knowledge, connect_device, start_cloud
from tandem.protocols.dragon.reference import CentralPair
from tandem.retrieval.embedder import HashingEmbedder
from tandem.transport import TransportConfig

NOTES = Path(__file__).resolve().parents[3] / "examples" / "private-notes"
QUESTION = "Write retry_async following our buoy retry policy, using asyncio.sleep with jitter."
CLOUD_TEXTS = [
    "asyncio.sleep(delay, result=None)\n\nCoroutine that completes after a given time (seconds).",
    "random.uniform(a, b)\n\nGet a random number in the range [a, b) or [a, b].",
    "time.monotonic()\n\nReturn the value (in fractional seconds) of a monotonic clock.",
]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference decodes in this thread; avoid oversubscription
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_real_model_greedy_dragon_over_tcp(real_lm, one_thread):
    embedder = HashingEmbedder(256)
    notes = [p.read_text() for p in sorted(NOTES.rglob("*")) if p.is_file()]
    device_knowledge = Knowledge.from_texts(notes, embedder, tokenizer=real_lm.tokenizer)
    cloud_knowledge = Knowledge.from_texts(CLOUD_TEXTS, embedder, tokenizer=real_lm.tokenizer)
    config = DragonConfig(max_new_tokens=6, scorer="bm25", bandwidth_probe_bytes=0)
    transport = TransportConfig(
        secret=b"real", tokenizer_hash=real_lm.tokenizer.fingerprint, vocab_size=real_lm.vocab_size
    )

    async def main():
        reports = []
        server = await start_cloud(
            "127.0.0.1", 0, lm=real_lm, knowledge=cloud_knowledge, transport=transport,
            reports=reports,
        )  # fmt: skip
        try:
            device = await connect_device(
                "127.0.0.1", server.port, transport=transport, lm=real_lm,
                knowledge=device_knowledge, question=QUESTION, config=config,
            )  # fmt: skip
        finally:
            await server.close()
        return device, reports

    rows_before = real_lm.rows_in_use()
    gc.disable()  # what the sessions leave in reference cycles stays: their rows must not
    try:
        device, reports = asyncio.run(main())
        assert real_lm.rows_in_use() <= rows_before  # both sides gave their rows back
    finally:
        gc.enable()
    expected = CentralPair.build(
        device_lm=real_lm,
        cloud_lm=real_lm,
        device_knowledge=device_knowledge,
        cloud_knowledge=cloud_knowledge,
        question=QUESTION,
        config=config,
    ).greedy()
    assert device.tokens == expected
    assert reports and reports[0].tokens == expected
    assert len(device.docs) == 2 and device.peer_docs == 2
    assert device.aggregations == len(expected) and not device.degraded
    assert 0 < device.bytes_sent < 2000 * len(expected)  # sparse top-p laws, not dense ones
