"""`tandem cloud serve` and `tandem device run` as separate processes over loopback TCP, and
their one-line errors (unreachable cloud, refused handshake, bad flags)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

SECRET = "cli-secret"


def tandem(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from tandem.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def cloud_port():
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tandem.cli import main; main()", "cloud", "serve",
         "--model", "tiny-qwen2-b", "--port", "0", "--secret", SECRET],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # "tandem cloud: ... on 127.0.0.1:<port>"
        assert "serving" in line, proc.stderr.read() if proc.poll() is not None else line
        yield int(line.strip().rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def device(port: int, *args: str) -> subprocess.CompletedProcess:
    return tandem(
        "device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi", "-n", "12",
        "--port", str(port), "--secret", SECRET, *args,
    )  # fmt: skip


def test_device_and_cloud_processes_generate(cloud_port, tmp_path):
    out = device(cloud_port, "--pipeline", "async", "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stderr
    assert "throughput" in out.stderr and "T_verify" in out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["tokens"]) == 12 and report["cloud"]["agrees_with_device"]
    # no --codec: the device's sparse default (spec.config.DEVICE_CODEC), not dense
    assert report["config"]["codec"] == "k-sqs"
    assert report["config"]["codec_params"] == {"k": 3, "ell": 100}
    k8 = ("--pipeline", "async", "--codec-param", "k=8", "--json", str(tmp_path / "k8.json"))
    out = device(cloud_port, *k8)
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "k8.json").read_text())["config"]
    assert (config["codec"], config["codec_params"]) == ("k-sqs", {"k": 8, "ell": 100})
    dense = ("--pipeline", "async", "--codec", "dense", "--json", str(tmp_path / "dense.json"))
    out = device(cloud_port, *dense)
    assert out.returncode == 0, out.stderr
    dense = json.loads((tmp_path / "dense.json").read_text())
    assert dense["config"]["codec"] == "dense" and dense["tokens"] == report["tokens"]


def test_cloud_autoregressive_mode(cloud_port):
    out = device(cloud_port, "--mode", "ar")
    assert out.returncode == 0, out.stderr
    assert "12 tokens" in out.stderr


def test_adaptive_pipeline_is_the_default_runs_eager_and_says_what_it_measured(
    cloud_port, tmp_path
):
    out = device(cloud_port, "--json", str(tmp_path / "r.json"))  # no --pipeline: adaptive
    assert out.returncode == 0, out.stderr
    assert "adaptive: ran as eager" in " ".join(out.stderr.split())
    record = json.loads((tmp_path / "r.json").read_text())
    assert len(record["tokens"]) == 12 and record["adaptive"]["ran"] == "eager"
    assert record["adaptive"]["next"] in ("ar", "eager") and record["config"]["pipeline"] == "eager"
    # an uplink eager cannot carry: the default is PicoSpec's async pipeline, no controller
    out = device(cloud_port, "--codec", "separate", "--json", str(tmp_path / "sep.json"))
    assert out.returncode == 0, out.stderr
    record = json.loads((tmp_path / "sep.json").read_text())
    assert record["config"]["pipeline"] == "async" and "adaptive" not in record
    assert len(record["tokens"]) == 12


def test_wrong_secret_is_one_line(cloud_port):
    out = tandem("device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi",
                 "--port", str(cloud_port), "--secret", "wrong", "--no-fallback")  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_unreachable_cloud_is_one_line():
    start = time.perf_counter()
    out = tandem("device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi", "--port", "1",
                 "--no-fallback")  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: cannot connect to 127.0.0.1:1")
    assert out.stderr.count("\n") == 1 and time.perf_counter() - start < 60


def test_unreachable_cloud_falls_back_by_default(tiny_lm, tmp_path):
    from tandem.config import SamplingConfig
    from tandem.protocols.local import generate

    out = tandem("device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi", "--port", "1",
                 "-n", "6", "--json", str(tmp_path / "run.json"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stderr.split())
    assert "fell back at token 0: cannot connect to 127.0.0.1:1" in said
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["degraded"] is True and record["degraded_at"] == 0
    ids = tiny_lm.tokenizer.encode("hi")
    expected = generate(tiny_lm, ids, SamplingConfig(temperature=0, max_new_tokens=6)).tokens
    assert record["tokens"] == expected


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--pipeline", "sometimes"), "error: spec: pipeline must be one of sync, async"),
        (("--codec", "zip"), "error: spec: codec must be one of"),
        (("--codec-param", "k"), "error: --codec-param expects NAME=VALUE"),
        (("--mode", "nope"), "error: unknown mode 'nope'"),
        (("--mode", "ar", "--pipeline", "adaptive"), "error: --pipeline adaptive is for --mode"),
    ],
)
def test_bad_flags_are_one_line(flags, message):
    out = tandem("device", "run", "--model", "tiny-qwen2", *flags)
    assert out.returncode == 2
    assert out.stderr.startswith(message) and out.stderr.count("\n") == 1
