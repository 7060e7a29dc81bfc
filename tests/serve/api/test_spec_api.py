"""Spec mode behind the HTTP API, against a live cloud on loopback: greedy answers equal the
cloud model's greedy answers; a cloud that dies mid-stream (or is not there) leaves an answer
the device finished alone, with no token lost or repeated; a cloud that comes back is used."""

from __future__ import annotations

from pathlib import Path

import httpx2 as httpx
import pytest

from tandem.serve.api.backends import GenParams

from .helpers import CloudThread, api, greedy_text, greedy_tokens, sse_events, visible

N = 24
NOTES = Path(__file__).parents[3] / "examples" / "private-notes"


def completion(url: str, prompt: str, n: int = N, **extra) -> dict:
    body = {"model": "tiny-qwen2", "prompt": prompt, "max_tokens": n, "temperature": 0, **extra}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize(
    "knobs", [{"pipeline": "sync"}, {"pipeline": "eager", "branch_below": 1.0, "branch_len": 2}]
)
def test_spec_greedy_equals_the_cloud_models_greedy(tiny_lm, tiny_lm_b, knobs):
    """Stop-and-wait, and eager with a branch wherever it may open one."""
    cloud = CloudThread(tiny_lm_b)
    server = api(tiny_lm, mode="spec", cloud=f"127.0.0.1:{cloud.port}", **knobs)
    try:
        for prompt in ("import os\n", "def add(a, b):"):
            reply = completion(server.url, prompt)
            expected = greedy_text(tiny_lm_b, tiny_lm.tokenizer.encode(prompt), N)
            assert reply["choices"][0]["text"] == expected
            info = reply["tandem"]
            assert info["mode"] == "spec" and info["degraded"] is False
            assert info["bytes_up"] > 0 and info["bytes_down"] > 0
            assert server.app.state.engine.backend.spec.codec == "k-sqs"  # the device default
            assert 0.0 <= info["acceptance_rate"] <= 1.0
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        assert health["cloud"]["reachable"] is True
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert 'tandem_device_requests_total{mode="spec",status="200"} 2' in metrics
        assert "tandem_device_bytes_up_total" in metrics
    finally:
        server.stop()
        cloud.stop()


def test_adaptive_keeps_one_controller_and_the_cloud_models_greedy(tiny_lm, tiny_lm_b):
    """`pipeline = "adaptive"`: the first request speculates (nothing measured yet: eager);
    the controller lives across requests; where it plans cloud AR the request runs as the
    cloud's AR stream, and every `explore_every`-th such request runs eager again to measure
    speculation. Every time the answer is the cloud model's greedy answer."""
    from tandem.protocols.spec.planner import Controller

    cloud = CloudThread(tiny_lm_b)
    server = api(tiny_lm, mode="spec", cloud=f"127.0.0.1:{cloud.port}", pipeline="adaptive",
                 branch_below=0.5)  # fmt: skip
    backend = server.app.state.engine.backend
    prompt = "def add(a, b):"
    expected = greedy_text(tiny_lm_b, tiny_lm.tokenizer.encode(prompt), N)
    try:
        controller = backend.controller
        assert isinstance(controller, Controller)
        reply = completion(server.url, prompt)
        assert reply["choices"][0]["text"] == expected
        assert reply["tandem"]["plan"] == "eager" and reply["tandem"]["degraded"] is False
        assert backend.controller is controller and controller._t_draft is not None  # measured
        slow = controller._t_draft = 10 * controller.costs().t_ar  # drafting cannot pay now
        backend.generations.explore_every = 2  # the 2nd request in a row planned AR explores
        reply = completion(server.url, prompt)
        assert reply["choices"][0]["text"] == expected
        assert reply["tandem"]["plan"] == "ar" and reply["tandem"]["bytes_down"] > 0
        assert controller._t_draft == slow  # an AR stream drafts nothing
        reply = completion(server.url, prompt)
        assert reply["choices"][0]["text"] == expected
        assert reply["tandem"]["plan"] == "explore" and not controller.exploring
        assert controller._t_draft < slow  # speculation measured again
    finally:
        server.stop()
        cloud.stop()


def test_the_device_defaults_to_the_adaptive_pipeline(tiny_lm):
    """No pipeline set: adaptive (one controller), or PicoSpec's async pipeline under an uplink
    the eager pipeline cannot carry; the library's SpecSettings has the same defaults."""
    from tandem.serve.api.backends import SpecSettings
    from tandem.serve.api.server import build_backend
    from tandem.serve.settings import DeviceServeSettings

    def backend(**settings):
        return build_backend(DeviceServeSettings(model=tiny_lm.name, **settings), tiny_lm)

    adaptive = backend(mode="spec")
    assert adaptive.spec.pipeline == "adaptive" and adaptive.controller is not None
    assert adaptive.config(GenParams(max_tokens=4)).pipeline == "eager"
    assert (adaptive.spec.codec, adaptive.spec.codec_params) == ("k-sqs", {"k": 3, "ell": 100})
    for codec in ("separate", "c-sqs"):
        fixed = backend(mode="spec", codec=codec)
        assert fixed.spec.pipeline == "async" and fixed.controller is None
    assert backend(mode="spec", pipeline="sync").spec.pipeline == "sync"
    assert SpecSettings() == adaptive.spec
    private = backend(mode="private-spec", corpus=str(NOTES))  # its own default: async
    assert private.config(GenParams(max_tokens=4)).pipeline == "async"


def test_adaptive_is_for_spec_only(tiny_lm):
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match="adaptive is for --mode spec"):
        api(tiny_lm, mode="private-spec", corpus="stdlib", pipeline="adaptive")


def test_cloud_killed_mid_stream_then_back(tiny_lm, tiny_lm_b):
    n, prompt = 40, "class Stack:\n"
    ids = tiny_lm.tokenizer.encode(prompt)
    cloud = CloudThread(tiny_lm_b)
    port = cloud.port
    # 40 ms on the device -> cloud direction: the answer takes long enough to kill the cloud
    server = api(tiny_lm, mode="spec", cloud=f"127.0.0.1:{port}", pipeline="sync", delay=40)
    body = {"model": "tiny-qwen2", "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": True}  # fmt: skip
    try:
        lines = []
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 3:  # the role chunk, a blank line, the first token's text
                    cloud.stop()
        events = sse_events(lines)
        assert events[-1] == "[DONE]"
        final = events[-2]
        info = final["tandem"]
        assert info["degraded"] is True and "cloud" in info["degraded_reason"]
        k = info["degraded_at"]
        assert 1 <= k < n
        # the committed prefix is the cloud's greedy answer; the rest, the device's own
        # greedy continuation of it: nothing lost, nothing repeated
        prefix = greedy_tokens(tiny_lm_b, ids, n)[:k]
        rest = greedy_tokens(tiny_lm, ids + prefix, n - k)
        expected = visible(tiny_lm, prefix + rest)
        streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
        assert streamed == expected
        assert final["usage"]["completion_tokens"] == len(prefix + rest)
        assert final["choices"][0]["finish_reason"] in ("length", "stop")
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        assert health["status"] == "ok" and health["cloud"]["reachable"] is False

        cloud = CloudThread(tiny_lm_b, port=port)  # the cloud comes back on the same port
        reply = completion(server.url, prompt, n=12)
        assert reply["tandem"]["degraded"] is False
        assert reply["choices"][0]["text"] == greedy_text(tiny_lm_b, ids, 12)
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert 'tandem_device_degraded_total{mode="spec"} 1' in metrics
    finally:
        server.stop()
        cloud.stop()


def test_unreachable_cloud_degrades_to_the_device_model(tiny_lm):
    cloud = CloudThread(tiny_lm)  # take a free port, then close it: nothing listens there
    port = cloud.port
    cloud.stop()
    server = api(tiny_lm, mode="spec", cloud=f"127.0.0.1:{port}")
    try:
        reply = completion(server.url, "x = [")
        info = reply["tandem"]
        assert info["degraded"] is True and info["degraded_at"] == 0
        assert "connect" in info["degraded_reason"]
        expected = greedy_text(tiny_lm, tiny_lm.tokenizer.encode("x = ["), N)
        assert reply["choices"][0]["text"] == expected
    finally:
        server.stop()
