"""Dragon mode behind the HTTP API: the device's private corpus stays on the device, the
answer equals centralised greedy decoding over both corpora, and the `tandem` object says
who aggregated."""

from __future__ import annotations

import httpx2 as httpx

from tandem.protocols.dragon import DragonConfig, Knowledge
from tandem.protocols.dragon.reference import CentralPair
from tandem.protocols.dragon.setup import SideSetup
from tandem.retrieval.embedder import HashingEmbedder
from tandem.serve.api.retrieval import DragonBackend
from tandem.serve.api.server import device_transport_for
from tandem.serve.settings import DeviceServeSettings

from .helpers import SECRET, CloudThread, api, visible

DEVICE_TEXTS = ["Our retry policy: base delay 0.5 s, factor 2, at most 5 attempts."]
CLOUD_TEXTS = ["asyncio.sleep(delay) suspends the current task for delay seconds."]
QUESTION = "write a retry function"
N = 12


def test_dragon_greedy_equals_central_greedy(tiny_lm, tiny_lm_b):
    embedder = HashingEmbedder(64)
    device_knowledge = Knowledge.from_texts(DEVICE_TEXTS, embedder)
    cloud_knowledge = Knowledge.from_texts(CLOUD_TEXTS, embedder)
    cloud = CloudThread(tiny_lm_b, dragon=SideSetup(tiny_lm_b, cloud_knowledge, None))
    settings = DeviceServeSettings(model=tiny_lm.name, mode="dragon",
                                   cloud=f"127.0.0.1:{cloud.port}")  # fmt: skip
    backend = DragonBackend(
        SideSetup(tiny_lm, device_knowledge, None), host="127.0.0.1", port=cloud.port,
        transport=device_transport_for(tiny_lm, settings, SECRET), strategy="dragon", docs=2,
    )  # fmt: skip
    server = api(tiny_lm, backend=backend, mode="dragon")
    try:
        body = {"model": tiny_lm.name, "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": N, "temperature": 0, "seed": 3}  # fmt: skip
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()
        cloud.stop()
    config = DragonConfig(max_new_tokens=N, temperature=0.0, seed=3, docs_per_side=2)
    expected = CentralPair.build(
        device_lm=tiny_lm, cloud_lm=tiny_lm_b, device_knowledge=device_knowledge,
        cloud_knowledge=cloud_knowledge, question=QUESTION, config=config,
    ).greedy()  # fmt: skip
    reply = reply.json()
    assert reply["choices"][0]["message"]["content"] == visible(tiny_lm, expected)
    info = reply["tandem"]
    assert info["mode"] == "dragon" and info["degraded"] is False
    assert sum(info["aggregated_by"].values()) >= 1 and info["bytes_up"] > 0
    assert info["docs"] >= 1 and info["peer_docs"] >= 1
