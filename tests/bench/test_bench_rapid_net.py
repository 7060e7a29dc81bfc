"""`tandem bench rapid-net` on the tiny model: the split run and the cloud-AR baseline over the
emulated link, side by side (the real run uses Qwen; see docs/rapid.md)."""

from __future__ import annotations

import json

import pytest

from benchmarks.rapid_net import run
from tandem.testbed.cpus import plan


@pytest.mark.slow
def test_bench_rapid_net_writes_every_method_at_every_rtt(tmp_path):
    run(out=tmp_path, rtts=(0, 40), context_tokens=2000, num_tasks=1, max_new_tokens=4,
        model="tiny-qwen2")  # fmt: skip
    saved = json.loads((tmp_path / "rapid_net.json").read_text())
    assert (tmp_path / "rapid_net.png").stat().st_size > 0
    for role, cores in plan().items():  # one model instance per side, on its own cores
        assert saved["machines"]["observed"][role]["cpus"] == cores
    keys = {(r["method"], r["rtt_ms"]) for r in saved["table"]}
    assert keys == {("rapid-local", -1.0), ("lc-local", -1.0)} | {
        (m, r) for m in ("rapid-edge", "lc-cloud") for r in (0, 40)
    }
    edge = [r for r in saved["rows"] if r["method"] == "rapid-edge"]
    assert all(r["tokens"] == 4 and r["uplink_bytes"] > 0 for r in edge)
    delayed = next(r for r in edge if r["rtt_ms"] == 40)
    assert delayed["total_s"] >= 0.04  # at least the opening round trip
