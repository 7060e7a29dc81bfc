"""`tandem cloud serve` with --config, the admission flags, --metrics-port and --log-format json,
as a real process on loopback: file values apply, flags given override them, a refusal names
its limit, /metrics answers, and every session leaves one JSON log line per event."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

SECRET = "cli-secret"


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from tandem.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def cloud_serve(*args: str) -> tuple[subprocess.Popen, str]:
    """A `tandem cloud serve` process and the port it serves on (its first stdout line)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tandem.cli import main; main()", "cloud", "serve", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    if "tiny-qwen2-b serving" not in line:
        proc.kill()
        raise AssertionError(proc.communicate(timeout=30)[1] or line)
    return proc, line.strip().rsplit(":", 1)[1]


def test_cloud_serve_config_flags_metrics_and_json_logs(tmp_path):
    config = tmp_path / "tandem.toml"
    config.write_text('[cloud]\nmodel = "tiny-qwen2-b"\nmax_context = 16\nlog_format = "text"\n')
    proc, port = cloud_serve(
        "--config", str(config), "--port", "0", "--secret", SECRET, "--metrics-port", "0",
        "--log-format", "json", "--batch-window-ms", "1",
    )  # fmt: skip
    try:
        metrics_url = proc.stdout.readline().split(" on ", 1)[1].strip()

        def device(n: int) -> subprocess.CompletedProcess:
            return tandem("device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi",
                          "-n", str(n), "--port", port, "--secret", SECRET)  # fmt: skip

        served = device(12)  # 2 + 12 tokens <= max_context 16 (from the file)
        refused = device(20)
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert served.returncode == 0, served.stderr
    # a refusing cloud is a fallback, as in the HTTP API: the device answers alone, and says why
    assert refused.returncode == 0, refused.stderr
    said = " ".join(refused.stderr.split())
    assert (
        "fell back at token 0: cloud error: context too long: 22 tokens (prompt + new) > "
        "max_context 16; the device model finished the answer alone (20 tokens" in said
    )
    assert 'tandem_cloud_refusals_total{reason="max_context"} 1' in text
    assert 'tandem_cloud_sessions_total{mode="spec"} 1' in text
    records = [json.loads(x) for x in err.splitlines() if x.startswith("{")]  # --log-format json
    assert [r["event"] for r in records] == ["session_start", "session_end", "session_refused"]
    assert records[1]["tokens"] == 12 and records[2]["refusal"] == "max_context"


def test_text_logs_hold_tandem_records_and_only_other_libraries_warnings():
    """Text logs (the default) show tandem's session records; faiss's loader, which logs each
    SIMD build it tries at INFO ("Could not load library with AVX512 support ..."), stays out."""
    notes = Path(__file__).resolve().parents[2] / "examples" / "private-notes"
    proc, port = cloud_serve(
        "--model", "tiny-qwen2-b", "--corpus", str(notes), "--port", "0", "--secret", SECRET
    )
    try:
        served = tandem("device", "run", "--model", "tiny-qwen2", "--raw", "-p", "hi", "-n", "4",
                        "--port", port, "--secret", SECRET)  # fmt: skip
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert served.returncode == 0, served.stderr
    assert "tandem.cloud session_start" in err and "session_end" in err, err
    assert "faiss" not in err and "Could not load library" not in err, err
