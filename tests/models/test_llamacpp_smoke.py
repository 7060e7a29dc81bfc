"""The installed llama-cpp-python really decodes: one real greedy completion with the 0.5B model,
run in a child process so that a bad build (a crash inside llama_decode was seen once with a
default build) fails this test with its exit status instead of killing the test run."""

from __future__ import annotations

import os
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


@pytest.mark.slow
def test_flash_attention_is_a_switch_with_its_own_kv_files():
    """`flash_attn=True` decodes the same greedy completion; its KV layout differs (V is not
    transposed), so it has its own fingerprint and never loads the other layout's KV files.
    The default f16 fingerprint did not change with the switch (older KV files still load)."""
    from tandem.config import SamplingConfig
    from tandem.models.registry import load_model
    from tandem.protocols.local import generate

    plain = load_model("qwen2.5-coder-0.5b", progress=False, backend="llamacpp", n_ctx=512)
    flash = load_model(
        "qwen2.5-coder-0.5b", progress=False, backend="llamacpp", n_ctx=512, flash_attn=True
    )
    quantized = load_model(
        "qwen2.5-coder-0.5b", progress=False, backend="llamacpp", n_ctx=512, kv_type="q8_0"
    )
    assert (plain.flash_attn, flash.flash_attn, quantized.flash_attn) == (False, True, True)
    assert len({plain.fingerprint, flash.fingerprint, quantized.fingerprint}) == 3
    ids = plain.tokenizer.encode("def add(a, b):\n    return")
    config = SamplingConfig(temperature=0, max_new_tokens=4, stop_at_eos=False)
    assert generate(flash, ids, config).tokens == generate(plain, ids, config).tokens


PINNED_AFTER_LOAD = """
import os
from tandem.config import SamplingConfig
from tandem.models.registry import load_model
from tandem.protocols.local import generate
from tandem.testbed import cpus
lm = load_model("qwen2.5-coder-0.5b", progress=False, backend="llamacpp", threads=2, n_ctx=512)
assert lm.threads == 2
cpus.pin(sorted(os.sched_getaffinity(0))[:1])  # one core, after the model loaded
ids = lm.tokenizer.encode("def add(a, b):\\n    return")
out = generate(lm, ids, SamplingConfig(temperature=0, max_new_tokens=4, stop_at_eos=False))
print(lm.threads, repr(lm.tokenizer.decode(out.tokens)))
"""


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to load on")
def test_a_model_pinned_to_fewer_cores_after_loading_decodes_with_that_many_threads():
    """Loaded with two threads, then pinned to one core: the engine drops to one thread (two
    threads on one core spun in an OpenMP barrier and the decode never returned: the private
    demo loaded its model before pinning itself, 2026-11-29). A regression hangs: the timeout."""
    proc = subprocess.run(
        [sys.executable, "-c", PINNED_AFTER_LOAD], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    threads, _, text = proc.stdout.strip().partition(" ")
    assert threads == "1" and "a + b" in text, proc.stdout
