"""`tandem bench rapid-steps` (benchmarks.rapid_steps): variant checks and the slope fit."""

from __future__ import annotations

import pytest

from benchmarks.rapid_steps import VARIANTS, _slopes, run
from tandem.errors import TandemError


def test_unknown_variant_is_a_one_line_error(tmp_path):
    with pytest.raises(TandemError, match="variants must be among"):
        run(out=tmp_path, contexts=[1024], variants=["f16", "bf16"])
    assert not list(tmp_path.iterdir())  # nothing written, nothing loaded


def test_q8_0_variant_names_flash_attention_because_llama_cpp_needs_it():
    assert VARIANTS["q8_0+flash"] == {"kv_type": "q8_0"}  # LlamaCppLM turns flash on for it
    assert VARIANTS["f16"] == {"kv_type": "f16"}  # the backend's default: no flash attention


def test_slopes_are_ms_per_thousand_tokens():
    rows = [
        {"variant": "f16", "context": 4096, "decode_ms": 40.0, "block_ms": 120.0},
        {"variant": "f16", "context": 8192, "decode_ms": 60.0, "block_ms": 200.0},
        {"variant": "f16+flash", "context": 4096, "decode_ms": 55.0, "block_ms": 230.0},
    ]
    slopes = _slopes(rows)
    assert slopes["f16"] == pytest.approx({"decode": 5.0, "block": 20.0})
    assert "f16+flash" not in slopes  # one point: no slope
