"""Rapid mode behind the HTTP API: each request carries the device's local text
(`tandem_context`); the RAPID cloud verifies the device's drafts; without a cloud the device
answers alone from its own RAG prompt."""

from __future__ import annotations

import asyncio
import threading

import httpx2 as httpx
import pytest

from tandem.protocols.rapid.edge import cloud_handler
from tandem.protocols.rapid.prompts import drafter_prompt
from tandem.serve.cloud import cloud_transport
from tandem.transport import serve

from .helpers import SECRET, api, greedy_text

CONTEXT = "The deploy key rotates every Tuesday. Backups run at 02:00 UTC."


@pytest.fixture
def rapid_cloud(tiny_lm_b):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    transport = cloud_transport(tiny_lm_b, secret=SECRET)
    start = serve(cloud_handler(tiny_lm_b, CONTEXT * 4), "127.0.0.1", 0, config=transport)
    server = asyncio.run_coroutine_threadsafe(start, loop).result(30)
    yield server.port
    asyncio.run_coroutine_threadsafe(server.close(grace=1.0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def ask(url: str, **extra) -> httpx.Response:
    body = {"model": "tiny-qwen2", "prompt": "When do backups run?", "max_tokens": 10,
            "temperature": 0, **extra}  # fmt: skip
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_rapid_needs_a_context_and_collaborates(tiny_lm, rapid_cloud):
    server = api(tiny_lm, mode="rapid", cloud=f"127.0.0.1:{rapid_cloud}")
    try:
        reply = ask(server.url)
        assert reply.status_code == 400
        assert "rapid mode needs `tandem_context`" in reply.json()["error"]["message"]
        reply = ask(server.url, tandem_context=CONTEXT)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        info = body["tandem"]
        assert info["mode"] == "rapid" and info["degraded"] is False
        assert info["bytes_up"] > 0 and info["rounds"] >= 1
        assert 1 <= body["usage"]["completion_tokens"] <= 10
    finally:
        server.stop()


def test_rapid_without_a_cloud_answers_alone(tiny_lm):
    server = api(tiny_lm, mode="rapid", cloud="127.0.0.1:1")
    try:
        body = ask(server.url, tandem_context=CONTEXT).json()
    finally:
        server.stop()
    assert body["tandem"]["degraded"] is True
    ids = drafter_prompt(tiny_lm.tokenizer, CONTEXT, "When do backups run?")
    assert body["choices"][0]["text"] == greedy_text(tiny_lm, ids, 10)
