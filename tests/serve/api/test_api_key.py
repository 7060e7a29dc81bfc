"""The device API's key: `/v1/...` needs `Authorization: Bearer KEY` once a key is set (401
`invalid_api_key` without it or with another one, counted as a refusal); `/health` stays open;
`$TANDEM_API_KEY` sets it for `tandem device serve`; a non-loopback address without a key is
refused at start-up with one line."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx2 as httpx
import pytest
from openai import AuthenticationError, OpenAI

from tandem.errors import TandemError
from tandem.serve.api.server import ServerThread, build_app, build_backend, check_exposure
from tandem.serve.settings import DeviceServeSettings, load_settings

from .helpers import greedy_text

KEY = "sk-tandem-test-key"
BODY = {"model": "tiny-qwen2", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def keyed(tiny_lm):
    config = DeviceServeSettings(model=tiny_lm.name, mode="local", max_tokens=16)
    server = ServerThread(build_app(config, build_backend(config, tiny_lm), api_key=KEY)).start()
    yield server
    server.stop()


def post(server, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json=BODY, headers=headers, timeout=30)


def test_no_key_is_401_with_an_openai_error_body(keyed):
    reply = post(keyed)
    assert reply.status_code == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    error = reply.json()["error"]
    assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
    assert "Authorization: Bearer" in error["message"]
    for path in ("/v1/models",):
        assert httpx.get(f"{keyed.url}{path}", timeout=30).status_code == 401
    chat = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{keyed.url}/v1/chat/completions", json=chat, timeout=30).status_code == 401


@pytest.mark.parametrize(
    "header", [f"Bearer {KEY}x", "Bearer sk-other", f"Basic {KEY}", KEY, "Bearer", "Bearer é"]
)
def test_wrong_key_is_401(keyed, header):
    reply = post(keyed, {"Authorization": header.encode()})
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    assert KEY not in reply.text


def test_right_key_is_served_and_refusals_are_counted(keyed, tiny_lm):
    reply = post(keyed, {"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    ids = tiny_lm.tokenizer.encode(BODY["prompt"])
    assert reply.json()["choices"][0]["text"] == greedy_text(tiny_lm, ids, 4)
    client = OpenAI(base_url=f"{keyed.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny-qwen2"]
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{keyed.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{keyed.url}/health", timeout=30).json()["status"] == "ok"  # open
    metrics = httpx.get(f"{keyed.url}/metrics", timeout=30).text
    assert 'tandem_device_refusals_total{reason="invalid_api_key"}' in metrics


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "localhost", "[::1]", "::1"])
def test_loopback_needs_no_key(host):
    check_exposure(f"{host}:8000", None)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.7", "[::]", "example.org"])
def test_non_loopback_without_a_key_is_refused(host):
    with pytest.raises(TandemError, match=r"no API key is set: pass --api-key KEY or set \$TAND"):
        check_exposure(f"{host}:8000", None)
    check_exposure(f"{host}:8000", KEY)


def test_a_key_in_the_config_file_is_refused(tmp_path):
    config = tmp_path / "tandem.toml"
    config.write_text(f'[device]\napi_key = "{KEY}"\n')
    with pytest.raises(TandemError, match=r"device.api_key: not allowed in a file; set \$TANDEM_"):
        load_settings(config)


def serve(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", "from tandem.cli import main; main()", "device", "serve",
         "--mode", "local", "--model", "tiny-qwen2", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_cli_takes_the_key_from_the_environment():
    proc = serve("--listen", "127.0.0.1:0", env={**os.environ, "TANDEM_API_KEY": KEY})
    try:
        line = proc.stdout.readline()
        assert "http://" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.strip().rsplit(" ", 1)[1]
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
        headers = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{url}/v1/models", headers=headers, timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


def test_cli_refuses_a_public_address_without_a_key_in_one_line():
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc = serve("--listen", "0.0.0.0:0", env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("error: --listen 0.0.0.0:0 is reachable from other machines")
    assert "--api-key" in err and "TANDEM_API_KEY" in err
