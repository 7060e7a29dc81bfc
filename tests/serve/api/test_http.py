"""The HTTP layer over a scripted backend: OpenAI shapes, stop strings, streaming, errors that
name the problem (and leave the server up), metrics, queueing of concurrent requests."""

from __future__ import annotations

import json
import threading
import time

import httpx2 as httpx
import pytest

from tandem.models.tiny import ByteTokenizer
from tandem.serve.api.backends import FakeBackend, GenParams, GenResult, Recorder, StopGeneration

from .helpers import api, sse_events

SCRIPT = list(b"Hello, world! STOP here. ")  # cycled by the fake backend


class FakeLM:
    name = "fake-lm"
    vocab_size = ByteTokenizer.vocab_size
    tokenizer = ByteTokenizer()


@pytest.fixture(scope="module")
def server():
    backend = FakeBackend(FakeLM(), SCRIPT, mode="spec")
    srv = api(FakeLM(), backend=backend, max_context=256, max_tokens=64, mode="local")
    srv.backend = backend
    yield srv
    srv.stop()


def post(server, path: str, body, **kwargs) -> httpx.Response:
    if isinstance(body, dict | list):
        return httpx.post(f"{server.url}{path}", json=body, timeout=30, **kwargs)
    return httpx.post(f"{server.url}{path}", content=body, timeout=30, **kwargs)


def test_completion_shape_usage_and_tandem_object(server):
    reply = post(server, "/v1/completions", {"model": "fake-lm", "prompt": "hi", "max_tokens": 5})
    assert reply.status_code == 200
    body = reply.json()
    assert body["object"] == "text_completion" and body["model"] == "fake-lm"
    assert body["choices"][0]["text"] == "Hello"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    info = body["tandem"]
    assert info["mode"] == "spec" and info["degraded"] is False
    assert set(info["timings"]) == {"queue_s", "ttft_s", "generate_s", "tokens_per_s"}
    prompt_ids, params = server.backend.calls[-1]
    assert prompt_ids == list(b"hi") and params.max_tokens == 5


def test_request_parameters_reach_the_backend(server):
    body = {"model": "fake-lm", "prompt": "hi", "max_tokens": 3, "temperature": 0.5,
            "top_p": 0.9, "seed": 7}  # fmt: skip
    assert post(server, "/v1/completions", body).status_code == 200
    params = server.backend.calls[-1][1]
    assert (params.temperature, params.top_p, params.seed, params.question) == (0.5, 0.9, 7, "hi")


def test_stop_string_is_cut_and_finishes_with_stop(server):
    body = {"model": "fake-lm", "prompt": "hi", "max_tokens": 60, "stop": [" STOP", "zzz"]}
    reply = post(server, "/v1/completions", body).json()
    assert reply["choices"][0]["text"] == "Hello, world!"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == len("Hello, world! STOP")


def test_stream_holds_back_a_possible_stop_string(server):
    body = {"model": "fake-lm", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 60, "stop": "world", "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Hello, "
    assert all("w" not in c["choices"][0]["delta"].get("content", "") for c in chunks)
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["completion_tokens"] == len("Hello, world")
    assert final["tandem"]["mode"] == "spec"
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}


def test_eos_ends_with_stop(server):
    lm = FakeLM()
    backend = FakeBackend(lm, [*b"ok", lm.tokenizer.eos_token_id, *b"never"])
    srv = api(lm, backend=backend, mode="local")
    try:
        reply = post(srv, "/v1/completions", {"model": "fake-lm", "prompt": "x"}).json()
    finally:
        srv.stop()
    assert reply["choices"][0] == {"index": 0, "text": "ok", "finish_reason": "stop",
                                   "logprobs": None}  # fmt: skip
    assert reply["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    "body,status,words",
    [
        (b'{"model": "fake-lm", "prompt": ', 400, "malformed JSON"),
        (b"[1, 2]", 400, "JSON object"),
        ({"prompt": "hi"}, 400, "`model` is required"),
        ({"model": "gpt-4", "prompt": "hi"}, 404, "model `gpt-4` does not exist"),
        ({"model": "fake-lm", "prompt": ""}, 400, "`prompt` is empty"),
        ({"model": "fake-lm", "prompt": ["a", "b"]}, 400, "one prompt"),
        ({"model": "fake-lm", "prompt": [1, 999]}, 400, "token ids"),
        ({"model": "fake-lm", "prompt": "hi", "max_tokens": "8"}, 400, "`max_tokens`"),
        ({"model": "fake-lm", "prompt": "hi", "max_tokens": 0}, 400, "`max_tokens` must be >= 1"),
        ({"model": "fake-lm", "prompt": "hi", "max_tokens": 65}, 400, "at most 64"),
        ({"model": "fake-lm", "prompt": "x" * 250, "max_tokens": 10}, 400, "maximum context"),
        ({"model": "fake-lm", "prompt": "x" * 300}, 400, "the prompt is 300 tokens"),
        ({"model": "fake-lm", "prompt": "hi", "n": 2}, 400, "`n` must be 1"),
        ({"model": "fake-lm", "prompt": "hi", "temperature": 3}, 400, "`temperature`"),
        ({"model": "fake-lm", "prompt": "hi", "stop": 5}, 400, "`stop`"),
        ({"model": "fake-lm", "prompt": "hi", "stream": "yes"}, 400, "`stream`"),
    ],
)
def test_bad_requests_are_4xx_naming_the_problem(server, body, status, words):
    reply = post(server, "/v1/completions", body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"
    assert "Traceback" not in reply.text
    assert httpx.get(f"{server.url}/health", timeout=30).json()["status"] == "ok"


def test_bad_chat_requests(server):
    for body, words in [
        ({"model": "fake-lm", "messages": []}, "`messages` is empty"),
        ({"model": "fake-lm", "messages": [{"role": "system", "content": "x"}]}, "no user"),
        ({"model": "fake-lm", "messages": "hi"}, "`messages`"),
        ({"model": "fake-lm", "messages": [{"content": "hi"}]}, "role"),
    ]:
        reply = post(server, "/v1/chat/completions", body)
        assert reply.status_code == 400 and words in reply.json()["error"]["message"], reply.text


def test_unknown_route_and_method_are_openai_errors(server):
    reply = httpx.get(f"{server.url}/v1/nope", timeout=30)
    assert reply.status_code == 404 and "error" in reply.json()
    reply = httpx.get(f"{server.url}/v1/completions", timeout=30)
    assert reply.status_code == 405 and "error" in reply.json()


def test_models_health_and_metrics(server):
    models = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["fake-lm"]
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health == {"status": "ok", "mode": "spec", "model": "fake-lm", "cloud": None,
                      "queue_depth": 0}  # fmt: skip
    post(server, "/v1/completions", {"model": "fake-lm", "prompt": "hi", "max_tokens": 4})
    post(server, "/v1/completions", {"model": "nope", "prompt": "hi"})
    reply = httpx.get(f"{server.url}/metrics", timeout=30)
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text
    for name in ("tokens_total", "last_tokens_per_second", "acceptance_rate", "rtt_seconds",
                 "bytes_up_total", "bytes_down_total", "requests_total", "refusals_total",
                 "errors_total", "degraded_total"):  # fmt: skip
        assert f"# TYPE tandem_device_{name} " in text
    assert 'tandem_device_refusals_total{reason="model_not_found"}' in text
    assert 'tandem_device_requests_total{mode="spec",status="200"}' in text


class SlowBackend:
    """Counts generations running at once (must never exceed one)."""

    mode, needs_context = "local", False

    def __init__(self) -> None:
        self.lm, self.running, self.most, self.lock = FakeLM(), 0, 0, threading.Lock()
        self.emitted: list[int] = []  # tokens each generation emitted

    def generate(self, prompt_ids, params: GenParams, on_token) -> GenResult:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            recorder = Recorder(on_token)
            try:
                for token in prompt_ids[: params.max_tokens]:
                    time.sleep(0.02)
                    recorder(token)
            except StopGeneration:
                return GenResult(recorder.tokens, "stop")
            return GenResult(recorder.tokens, "length")
        finally:
            self.emitted.append(len(recorder.tokens))
            with self.lock:
                self.running -= 1

    async def cloud_reachable(self):
        return None


def test_concurrent_requests_queue_one_generation_at_a_time():
    backend = SlowBackend()
    srv = api(FakeLM(), backend=backend, mode="local")
    replies: dict[int, httpx.Response] = {}

    def ask(i: int) -> None:
        body = {"model": "fake-lm", "prompt": f"req{i}", "max_tokens": 4, "stream": i % 2 == 0}
        replies[i] = post(srv, "/v1/completions", body)

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        srv.stop()
    assert sorted(replies) == list(range(6)) and backend.most == 1
    for i, reply in replies.items():
        assert reply.status_code == 200
        if i % 2:
            assert reply.json()["choices"][0]["text"] == f"req{i}"
        else:
            events = sse_events(reply.text.splitlines())
            assert "".join(e["choices"][0]["text"] for e in events[:-1]) == f"req{i}"


class BrokenBackend(SlowBackend):
    def generate(self, prompt_ids, params, on_token):
        raise RuntimeError("the model fell over\nsecond line")


def test_a_failing_generation_is_a_one_line_500_and_the_server_stays_up():
    srv = api(FakeLM(), backend=BrokenBackend(), mode="local")
    try:
        reply = post(srv, "/v1/completions", {"model": "fake-lm", "prompt": "hi"})
        assert reply.status_code == 500
        message = reply.json()["error"]["message"]
        assert message == "generation failed: the model fell over second line"
        body = {"model": "fake-lm", "prompt": "hi", "stream": True}
        events = sse_events(post(srv, "/v1/completions", body).text.splitlines())
        assert events[-1] == "[DONE]" and "error" in events[-2]
        assert httpx.get(f"{srv.url}/health", timeout=30).status_code == 200
        assert "tandem_device_errors_total" in httpx.get(f"{srv.url}/metrics", timeout=30).text
    finally:
        srv.stop()


def test_request_log_lines_are_json(caplog):
    srv = api(FakeLM(), backend=FakeBackend(FakeLM(), SCRIPT), mode="local", log_format="json")
    try:
        with caplog.at_level("INFO", logger="tandem.serve.api"):
            post(srv, "/v1/completions", {"model": "fake-lm", "prompt": "hi", "max_tokens": 3})
    finally:
        srv.stop()
    records = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tandem.serve.api"]
    assert len(records) == 1
    record = records[0]
    assert record["status"] == 200 and record["completion_tokens"] == 3
    assert {"id", "mode", "prompt_tokens", "queue_s", "total_s", "degraded"} <= set(record)


def test_a_client_that_leaves_mid_stream_stops_its_generation():
    backend = SlowBackend()
    srv = api(FakeLM(), backend=backend, mode="local", max_tokens=512)
    try:
        body = {"model": "fake-lm", "prompt": "x" * 400, "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=30) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i == 4:
                    break  # leave: the response is closed
        reply = post(srv, "/v1/completions", {"model": "fake-lm", "prompt": "ok", "max_tokens": 2})
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "ok"
        assert backend.emitted[0] < 400  # the first generation ended early
    finally:
        srv.stop()
