"""The console script end to end, as a user runs it (subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def tandem(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from tandem.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_the_command_groups():
    out = tandem("--help")
    assert out.returncode == 0
    for group in ("models", "generate", "bench", "net", "index"):
        assert group in out.stdout


def test_unknown_model_is_one_line_without_traceback():
    out = tandem("generate", "--model", "no-such-model", "-n", "2")
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: unknown model 'no-such-model'")
    assert "Traceback" not in out.stderr


def test_generate_streams_with_tiny_model():
    out = tandem("generate", "--model", "tiny-qwen2", "-n", "5", "--raw", "-p", "hi")
    assert out.returncode == 0, out.stderr
    assert "5 tokens" in out.stderr and "tokens/s" in out.stderr


def test_bad_flag_value_is_rejected():
    out = tandem("generate", "--model", "tiny-qwen2", "--temperature", "-1")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_generate_with_real_model():
    out = tandem("generate", "-n", "16")
    assert out.returncode == 0, out.stderr
    assert "palindrome" in out.stdout.lower()  # greedy answer to the default prompt


@pytest.mark.parametrize(
    "args",
    [("cloud", "serve", "--listen", "nowhere"), ("device", "run", "--cloud", "nowhere")],
)
def test_bad_address_is_one_line(args):
    out = tandem(*args)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: expected HOST:PORT, got 'nowhere'"


def test_bench_lists_dragon_figures_and_serve():
    out = tandem("bench", "dragon", "--help")
    assert out.returncode == 0
    for command in ("latency", "ttft", "perplexity", "scheduling"):
        assert command in out.stdout
    assert "serve" in tandem("bench", "--help").stdout


def test_truncated_gguf_is_one_line_without_traceback(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "mine.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", np.ones((256, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    path.write_bytes(path.read_bytes()[:20_000])
    out = tandem("generate", "--model", str(path), "-n", "2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"error: {path}: truncated: 20000 of ")


def test_models_list_shows_a_damaged_cache_dir(tmp_path):
    import os

    from tandem.models.registry import REGISTRY

    folder = tmp_path / "gguf" / "qwen2.5-coder-0.5b"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "model.gguf").write_bytes(b"GGUF" + bytes(100))
    (folder / "DONE").write_text(REGISTRY["qwen2.5-coder-0.5b"].sha256 + "\n")
    out = subprocess.run(
        [sys.executable, "-c", "from tandem.cli import main; main()", "models", "list"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TANDEM_HOME": str(tmp_path), "COLUMNS": "250"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "llamacpp: DAMAGED (model.gguf: 104 bytes, expected 491400064)" in out.stdout


def test_output_to_a_log_is_not_wrapped_at_80_columns(tmp_path):
    """Piped output (a log, CI) gets a wide page: without it rich shrinks a wide table to
    cells of "…" (the models table needed COLUMNS=250 above). A COLUMNS the user set wins."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["TANDEM_HOME"] = str(tmp_path)
    code = "from tandem.cli import main; main()"

    def listing(**extra):
        out = subprocess.run(
            [sys.executable, "-c", code, "models", "list"],
            capture_output=True, text=True, timeout=300, env={**env, **extra},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    wide = listing()
    assert max(map(len, wide)) > 80 and not any("…" in line for line in wide)
    assert max(map(len, listing(COLUMNS="60"))) <= 60
