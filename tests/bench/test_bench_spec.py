"""`tandem bench spec` end to end on tiny models (the real run uses Qwen; see docs/spec.md)."""

from __future__ import annotations

import json

from benchmarks.spec import run
from tandem.testbed.cpus import plan


def test_bench_spec_writes_json_and_png(tmp_path):
    payload = run(
        out=tmp_path,
        regimes=("tiny",),
        rtts=(0, 40),
        methods=("cloud-ar", "vanilla-sd", "picospec", "async k-sqs"),
        num_prompts=1,
        max_new_tokens=6,
    )
    saved = json.loads((tmp_path / "spec.json").read_text())
    assert (tmp_path / "spec.png").stat().st_size > 0
    table = {(r["method"], r["rtt_ms"]): r for r in saved["table"]}
    assert set(table) == {
        (m, r) for m in ("cloud-ar", "vanilla-sd", "picospec", "async k-sqs") for r in (0, 40)
    }
    outputs = {tuple(r["tokens"]) for r in saved["runs"]}
    assert len(outputs) == 1  # greedy: every method produced the same tokens
    assert table[("picospec", 0)]["acceptance_rate"] == 1.0  # tiny regime: draft == target
    assert {r["draft_len"] for r in saved["draft_length"]} == {3, 4, 5, 6}
    assert saved["sqs"] and payload["theory"]
    dense = [r for r in saved["sqs"] if r["label"] == "dense"]
    assert all(r["bits_per_draft"] == 16 * 258 for r in dense)  # 258-token vocabulary, fp16
    sets = plan()  # each side's model calls ran on its own cores, one engine thread per core
    assert saved["machines"]["cpus"] == sets and len(saved["machines"]["load_average"]) == 2
    for role in ("device", "cloud"):
        seen = saved["machines"]["observed"]["tiny"][role]
        assert seen["cpus"] == sets[role] and seen["engine_threads"] == len(sets[role])
