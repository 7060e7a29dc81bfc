"""`tandem device serve` as a real process (local mode, tiny model), driven by the official
`openai` client: a streamed chat completion and a plain completion, both equal to the device
model's own greedy output; the config file is read and flags override it."""

from __future__ import annotations

import subprocess
import sys

import httpx2 as httpx
import pytest
from openai import BadRequestError, OpenAI

from .helpers import greedy_text


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = tmp_path_factory.mktemp("conf") / "tandem.toml"
    config.write_text(
        '[device]\nmode = "local"\nmodel = "tiny-qwen2"\nmax_tokens = 32\nlog_format = "json"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tandem.cli import main; main()", "device", "serve",
         "--config", str(config), "--listen", "127.0.0.1:0", "--max-tokens", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # "tandem device: ... on http://127.0.0.1:<port>"
        assert "http://" in line, proc.stderr.read() if proc.poll() is not None else line
        yield line.strip().rsplit(" ", 1)[1], proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def test_openai_client_streams_a_chat_completion(served, tiny_lm):
    url, _ = served
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "hi"}], stream=True,
        max_tokens=16, temperature=0,
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy_text(tiny_lm, tiny_lm.tokenizer.chat_prompt("hi"), 16)
    final = chunks[-1]
    assert final.choices[0].finish_reason in ("length", "stop")
    assert final.usage.completion_tokens <= 16
    assert final.model_extra["tandem"]["mode"] == "local"


def test_openai_client_completion_equals_local_greedy(served, tiny_lm):
    url, _ = served
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    reply = client.completions.create(
        model="tiny-qwen2", prompt="def add(a, b):", max_tokens=12, temperature=0
    )
    ids = tiny_lm.tokenizer.encode("def add(a, b):")
    assert reply.choices[0].text == greedy_text(tiny_lm, ids, 12)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.model_extra["tandem"]["degraded"] is False
    assert [m.id for m in client.models.list()] == ["tiny-qwen2"]


def test_flags_override_the_config_file(served):
    url, _ = served
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(BadRequestError, match="at most 20"):  # the file says 32, the flag 20
        client.completions.create(model="tiny-qwen2", prompt="x", max_tokens=21)
    assert httpx.get(f"{url}/health", timeout=30).json()["mode"] == "local"
