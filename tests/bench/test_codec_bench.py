"""`tandem bench codecs` runs end to end on the tiny model and writes its JSON and PNG."""

from __future__ import annotations

import json

from benchmarks.codecs import CODECS, run


def test_bench_writes_results_for_every_codec(tmp_path):
    result = run(out=tmp_path, quick=True, model="tiny-qwen2", num_tokens=6)
    saved = json.loads((tmp_path / "codecs.json").read_text())
    assert (tmp_path / "codecs.png").stat().st_size > 0
    assert set(saved["summary"]) == set(CODECS) == set(result["summary"])
    assert saved["config"]["num_tokens"] == 6
    dense = saved["summary"]["dense fp16"]
    assert dense["bytes_mean"] == 2 * saved["config"]["vocab"]
    for summary in saved["summary"].values():
        assert 0 <= summary["tv_mean"] <= summary["tv_bound_mean"] + 1e-9
