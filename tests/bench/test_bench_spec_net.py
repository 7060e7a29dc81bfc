"""`tandem bench spec-net` with tiny models: real processes over the loopback delay proxy."""

from __future__ import annotations

import json

import pytest

from benchmarks.spec_net import METHODS, run
from tandem.testbed.cpus import plan


@pytest.mark.slow
def test_bench_spec_net_runs_each_method_over_the_proxy(tmp_path):
    run(out=tmp_path, rtts=(0, 40), max_new_tokens=5, device_model="tiny-qwen2",
        cloud_model="tiny-qwen2", path="loopback")  # fmt: skip
    saved = json.loads((tmp_path / "spec_net.json").read_text())
    assert (tmp_path / "spec_net.png").stat().st_size > 0
    assert saved["setup"]["path"] == "loopback"
    assert saved["machines"]["cpus"] == plan()  # the cloud process, as the kernel saw it:
    assert saved["machines"]["observed"]["cloud"]["cpus"] == plan()["cloud"]
    assert {(r["method"], r["rtt_ms"]) for r in saved["table"]} == {
        (m, r) for m in METHODS for r in (0, 40)
    }
    outputs = {tuple(r["output"]) for r in saved["runs"]}
    assert len(outputs) == 1 and len(next(iter(outputs))) == 5  # greedy: one output for all
    slow = {r["method"]: r["total_s"] for r in saved["runs"] if r["rtt_ms"] == 40}
    assert all(seconds >= 0.04 for seconds in slow.values())  # at least one delayed round trip
