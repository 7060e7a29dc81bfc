"""The installed llama-cpp-python really decodes: one real greedy completion with the 0.5B model,
run in a child process so that a bad build (a crash inside llama_decode was seen once with a
default build) fails this test with its exit status instead of killing the test run."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
from tandem.models.registry import load_model
from tandem.config import SamplingConfig
from tandem.protocols.local import generate
lm = load_model("qwen2.5-coder-0.5b", progress=False, backend="llamacpp")
ids = lm.tokenizer.encode("def add(a, b):\\n    return")
out = generate(lm, ids, SamplingConfig(temperature=0, max_new_tokens=4, stop_at_eos=False))
print(repr(lm.tokenizer.decode(out.tokens)))
"""


@pytest.mark.slow
def test_llamacpp_build_decodes_a_real_completion():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "a + b" in proc.stdout, proc.stdout
