"""`tandem rapid ...` as a user runs it (subprocess, tiny model, hashing embedder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def tandem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from tandem.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # one thread: the machine is shared
    )


def test_rapid_run_compares_methods(tmp_path):
    context = tmp_path / "context.txt"
    context.write_text(" ".join(f"item{i} is in bucket {i % 7}." for i in range(120)))
    out = tandem(
        "rapid", "run", "--context", str(context), "-q", "Which bucket holds item12?",
        "--target", "tiny-qwen2", "--embedder", "hashing-64", "--chunk-tokens", "128",
        "--min-tokens", "256", "-n", "8", "--compare",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for method in ("rapid-exact", "sd", "lc"):
        assert method in out.stdout
    assert "retrieved tokens" in out.stdout


def test_rapid_errors_are_one_line(tmp_path):
    out = tandem("rapid", "run", "--context", str(tmp_path / "missing"), "-q", "x")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: cannot read")
    out = tandem("rapid", "run", "--context", str(tmp_path), "-q", "x", "--mode", "fast")
    assert out.returncode == 2 and "unknown RAPID mode" in out.stderr
    out = tandem("rapid", "serve", "--context", str(tmp_path), "--listen", "nowhere")
    assert out.returncode == 2 and out.stderr.strip() == "error: expected HOST:PORT, got 'nowhere'"


def test_rapid_tasks_writes_jsonl(tmp_path):
    path = tmp_path / "tasks.jsonl"
    out = tandem(
        "rapid", "tasks", "--out", str(path), "--context-tokens", "4000", "--num", "1",
        "--model", "tiny-qwen2",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert {r["kind"] for r in records} == {"default", "name", "quote"}
    assert all(r["needle"] in r["context"] for r in records)


def test_rapid_device_without_a_cloud_falls_back(tmp_path):
    local = tmp_path / "notes.txt"
    local.write_text("Backups run at 02:00 UTC. The deploy key rotates every Tuesday.")
    args = ("rapid", "device", "-q", "When do backups run?", "--retrieve-from", str(local),
            "--connect", "127.0.0.1:1", "--drafter", "tiny-qwen2", "--embedder", "hashing-64",
            "--chunk-tokens", "128", "--min-tokens", "256", "-n", "6")  # fmt: skip
    out = tandem(*args)
    assert out.returncode == 0, out.stderr
    assert "fell back at 0" in out.stdout and "cannot connect to 127.0.0.1:1" in out.stderr
    out = tandem(*args, "--no-fallback")
    assert out.returncode == 2 and out.stderr.startswith("error: cannot connect to 127.0.0.1:1")
