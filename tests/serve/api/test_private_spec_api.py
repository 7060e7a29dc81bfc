"""private-spec behind the HTTP API: with eta = 0 the answer is the cloud model's greedy answer
on its own public prompt; the `tandem` object counts each side's chunks; a cloud that is gone
leaves the device model to answer alone on its private prompt."""

from __future__ import annotations

import httpx2 as httpx

from tandem.protocols.dragon import Knowledge
from tandem.protocols.dragon.setup import SideSetup
from tandem.protocols.private_spec import rag_prompt
from tandem.retrieval.embedder import HashingEmbedder
from tandem.serve.api.retrieval import PrivateSpecBackend
from tandem.serve.api.server import device_transport_for
from tandem.serve.settings import DeviceServeSettings

from .helpers import SECRET, CloudThread, api, greedy_tokens, visible

DEVICE_TEXTS = ["Our retry policy: base delay 0.5 s, factor 2, at most 5 attempts."]
CLOUD_TEXTS = ["asyncio.sleep(delay) suspends the current task for delay seconds."]
QUESTION = "write a retry function"
N = 12


def ask(server, lm) -> dict:
    body = {"model": lm.name, "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": N, "temperature": 0, "seed": 3}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def backend_for(lm, knowledge, port: int) -> PrivateSpecBackend:
    settings = DeviceServeSettings(model=lm.name, mode="private-spec", cloud=f"127.0.0.1:{port}")
    return PrivateSpecBackend(
        lm, knowledge, host="127.0.0.1", port=port,
        transport=device_transport_for(lm, settings, SECRET), spec={"eta": 0.0}, docs=1,
    )  # fmt: skip


def test_private_spec_eta_zero_is_the_clouds_greedy_answer(tiny_lm, tiny_lm_b):
    embedder = HashingEmbedder(64)
    device_knowledge = Knowledge.from_texts(DEVICE_TEXTS, embedder)
    cloud_knowledge = Knowledge.from_texts(CLOUD_TEXTS, embedder)
    cloud = CloudThread(tiny_lm_b, dragon=SideSetup(tiny_lm_b, cloud_knowledge, None))
    server = api(tiny_lm, backend=backend_for(tiny_lm, device_knowledge, cloud.port),
                 mode="private-spec")  # fmt: skip
    try:
        reply = ask(server, tiny_lm)
    finally:
        server.stop()
        cloud.stop()
    public = rag_prompt(
        tiny_lm_b.tokenizer,
        cloud_knowledge.context(QUESTION, 1)[1],
        QUESTION,
    )
    expected = greedy_tokens(tiny_lm_b, public, N)
    assert reply["choices"][0]["message"]["content"] == visible(tiny_lm, expected)
    info = reply["tandem"]
    assert info["mode"] == "private-spec" and info["degraded"] is False
    assert info["docs"] == 1 and info["peer_docs"] == 1 and info["bytes_up"] > 0


def test_private_spec_without_a_cloud_answers_alone_on_the_private_prompt(tiny_lm):
    device_knowledge = Knowledge.from_texts(DEVICE_TEXTS, HashingEmbedder(64))
    cloud = CloudThread(tiny_lm)
    port = cloud.port
    cloud.stop()  # nobody listens there any more
    server = api(tiny_lm, backend=backend_for(tiny_lm, device_knowledge, port),
                 mode="private-spec")  # fmt: skip
    try:
        reply = ask(server, tiny_lm)
    finally:
        server.stop()
    private = rag_prompt(
        tiny_lm.tokenizer,
        device_knowledge.context(QUESTION, 1)[1],
        QUESTION,
    )
    assert reply["choices"][0]["message"]["content"] == visible(
        tiny_lm, greedy_tokens(tiny_lm, private, N)
    )
    assert reply["tandem"]["degraded"] is True
