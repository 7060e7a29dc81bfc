"""`tandem bench spec-regimes` on a fast emulated setting, and its ratio arithmetic."""

from __future__ import annotations

import json

import pytest

from benchmarks.spec_regimes import PAIR, Setting, decode_rate, ratios, run


def test_decode_rate_leaves_out_the_first_token():
    assert decode_rate({"tokens": 11, "ttft_ms": 500.0}, 2.5) == pytest.approx(10 / 2.0)


def test_ratios_divide_async_by_stop_and_wait_and_last_rtt_by_first():
    def row(method, rtt, rate):
        return {"setting": "s", "method": method, "rtt_ms": rtt, "throughput_tok_s": rate,
                "decode_tok_s": 2 * rate, "acceptance_rate": 0.9}  # fmt: skip

    rows = [row(PAIR[0], 0, 30.0), row(PAIR[1], 0, 20.0), row(PAIR[0], 200, 15.0),
            row(PAIR[1], 200, 10.0)]  # fmt: skip
    (entry,) = ratios(rows, (0, 200))
    assert entry["speedup"] == {0: pytest.approx(1.5), 200: pytest.approx(1.5)}
    assert entry["retention"] == pytest.approx(0.5)
    assert entry["decode_retention"] == pytest.approx(0.5)


def test_bench_spec_regimes_writes_json_and_png(tmp_path):
    run(out=tmp_path, settings=(Setting(1.0, 5),), rtts=(0, 20), num_prompts=1, max_new_tokens=6)
    saved = json.loads((tmp_path / "spec_regimes.json").read_text())
    assert (tmp_path / "spec_regimes.png").stat().st_size > 0
    assert {(r["method"], r["rtt_ms"]) for r in saved["rows"]} == {
        (m, r) for m in PAIR for r in (0, 20)
    }
    (entry,) = saved["summary"]
    assert entry["acceptance_rate"] == 1.0  # mix 1: the draft's logits are the target's
    assert all(r["tokens"] == 6 for r in saved["rows"])
