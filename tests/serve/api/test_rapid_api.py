"""Rapid mode behind the HTTP API: each request carries the device's local text
(`tandem_context`); the RAPID cloud verifies the device's drafts; without a cloud the device
answers alone from its own RAG prompt."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from tandem.protocols.rapid.prompts import drafter_prompt

from .helpers import RapidCloudThread, api, greedy_text

CONTEXT = "The deploy key rotates every Tuesday. Backups run at 02:00 UTC."


@pytest.fixture
def rapid_cloud(tiny_lm_b):
    cloud = RapidCloudThread(tiny_lm_b, CONTEXT * 4)
    yield cloud.port
    cloud.stop()


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
