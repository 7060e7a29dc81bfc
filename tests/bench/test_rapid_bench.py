"""`tandem bench rapid` (long contexts): the shared-context run on the tiny model, the KV file
cache across runs, the memo embedder, and the cost model's arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.rapid import (
    MemoEmbedder,
    _common_prefix,
    cost_model,
    paired_quality,
    run,
    sign_test_p,
    tokens_per_round,
)
from tandem.errors import TandemError
from tandem.retrieval.embedder import HashingEmbedder


def test_tokens_per_round():
    assert tokens_per_round(0.0, 5) == 1.0
    assert tokens_per_round(1.0, 5) == 6.0
    assert tokens_per_round(0.5, 2) == pytest.approx(1.75)


def test_common_prefix():
    assert _common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert _common_prefix([[7, 8]]) == [7, 8]


def test_memo_embedder_embeds_each_text_once():
    inner = HashingEmbedder(64)
    memo = MemoEmbedder(inner)
    first = memo.embed(["a b", "c d", "a b"])
    assert inner.texts_embedded == 2
    again = memo.embed(["c d", "e f"])
    assert inner.texts_embedded == 3
    np.testing.assert_array_equal(again[0], first[1])
    np.testing.assert_array_equal(first, inner.embed(["a b", "c d", "a b"]))
    assert memo.embed([]).shape == (0, 64)


def _summary(speedups: dict[int, float], acceptance: float) -> list[dict]:
    return [
        {"context": c, "method": "rapid-exact", "speedup": s, "acceptance": acceptance}
        for c, s in speedups.items()
    ]


def test_cost_model_predicts_the_crossover_of_linear_costs():
    """t_lc = 10 + 0.004 L ms, t_v = 30 + 0.004 L (a block reads the KV once), t_d = 10,
    gamma 2, a = 1 (E = 3): speedup(L) = 3 (10 + 0.004 L) / (50 + 0.004 L) = 1 at L = 2500."""
    gamma = 2
    costs = {
        c: {"decode_ms": 10 + 0.004 * c, "block_ms": 30 + 0.004 * c, "draft_ms": 10.0}
        for c in (1000, 2000, 4000, 8000)
    }
    truth = {c: 3 * (10 + 0.004 * c) / (50 + 0.004 * c) for c in costs}
    model = cost_model(costs, _summary(truth, 1.0), gamma=gamma)
    assert model["crossover_predicted"] == pytest.approx(2500.0)
    for row in model["per_context"]:
        assert row["predicted_speedup"] == pytest.approx(truth[row["context"]])
        assert row["error"] == pytest.approx(0.0, abs=1e-12)
    # measured: linear interpolation between 2000 (0.909) and 4000 (1.364)
    assert 2000 < model["crossover_measured"] < 4000
    off = cost_model(costs, _summary({c: 2.0 for c in costs}, 1.0), gamma=gamma)
    assert off["crossover_measured"] is None and off["crossover_measured_bound"] == "< 1000"


def test_bench_runs_on_shared_contexts_and_reuses_the_saved_prefill(tmp_path):
    kw = dict(
        model="tiny-qwen2", contexts=[900], tasks_per_kind=1, max_new_tokens=6, sweep_tasks=0,
        gamma=2, embedder="hashing-256", chunk_tokens=128, min_tokens=256,
        kv_cache=tmp_path / "kv", out=tmp_path, threads=1,
    )  # fmt: skip
    first = run(**kw)
    rows = first["rows"]
    tasks = {r["task"] for r in rows}
    assert len(tasks) >= 2 and {r["method"] for r in rows} == {
        "lc", "rag", "sd", "streaming", "rapid-exact", "rapid-paper"
    }  # fmt: skip
    assert first["prefill"][900]["loaded_from_cache"] is False
    assert first["settings"]["shared_context"] and first["settings"]["threads"] == 1
    assert {"decode_ms", "block_ms", "draft_ms"} <= set(first["step_costs"][900])
    assert first["cost_model"]["per_context"][0]["context"] == 900
    saved = json.loads((tmp_path / "rapid.json").read_text())
    assert saved["summary"] and (tmp_path / "rapid.png").is_file()
    for s in saved["summary"]:  # each method's paired comparison with LC, task by task
        q = s.get("quality_vs_lc")
        assert (q is None) == (s["method"] == "lc")
        assert q is None or q["better"] + q["worse"] + q["tied"] == q["tasks"] == s["tasks"]
        assert s["samples"] == s["tasks"] == len(tasks)
        assert (s.get("quality_vs_rag") is None) == (s["method"] == "rag")  # and with RAG
    second = run(**kw, methods=("lc", "rapid-exact"), name="again")
    assert second["prefill"][900]["loaded_from_cache"] is True
    assert second["prefill"][900]["prefill_s"] == pytest.approx(first["prefill"][900]["prefill_s"])
    by = lambda payload: {  # noqa: E731
        r["task"]: r["text"] for r in payload["rows"] if r["method"] == "lc"
    }
    assert by(second) == by(first)  # same prompts, same seeds, from the loaded KV
    assert {r["method"] for r in second["rows"]} == {"lc", "rapid-exact"}
    seeded = run(**{**kw, "temperature": 1.0}, methods=("lc", "rapid-exact"), seeds=2, name="s")
    assert seeded["settings"]["seeds"] == 2
    for s in seeded["summary"]:
        assert (s["tasks"], s["samples"]) == (len(tasks), 2 * len(tasks))
    texts = {(r["task"], r["seed"]): r["text"] for r in seeded["rows"] if r["method"] == "lc"}
    assert len(texts) == 2 * len(tasks)
    assert any(texts[t, 0] != texts[t, 1] for t in tasks)  # the seeds draw other samples


def test_bench_rejects_unknown_methods_and_a_run_without_lc(tmp_path):
    with pytest.raises(TandemError, match="methods must be among"):
        run(model="tiny-qwen2", methods=("lc", "magic"), out=tmp_path)
    with pytest.raises(TandemError, match="seeds must be at least 1"):
        run(model="tiny-qwen2", seeds=0, out=tmp_path)
    with pytest.raises(TandemError, match="lc method"):
        run(model="tiny-qwen2", methods=("rapid-exact",), out=tmp_path)


def test_sign_test_matches_the_binomial_tails():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 3) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)  # both 5:0 and 0:5
    assert sign_test_p(1, 9) == pytest.approx(2 * 11 / 1024)  # P(<= 1 of 10) both sides
    assert sign_test_p(8, 2) == sign_test_p(2, 8)


def test_paired_quality_compares_each_task_with_lc_on_the_same_task():
    rows = [
        {"context": c, "task": t, "method": m, "quality": q}
        for c, t, m, q in [
            (1, "a", "lc", 0.5), (1, "b", "lc", 0.0), (1, "c", "lc", 1.0),
            (1, "a", "x", 0.7), (1, "b", "x", 0.0), (1, "c", "x", 0.4),
            (2, "a", "lc", 0.0), (2, "a", "x", 1.0),
        ]
    ]  # fmt: skip
    out = paired_quality(rows, "context")
    one = out[1, "x"]
    assert (one["tasks"], one["better"], one["worse"], one["tied"]) == (3, 1, 1, 1)
    assert one["mean_delta"] == pytest.approx((0.2 + 0.0 - 0.6) / 3)
    half = 1.96 * np.std([0.2, 0.0, -0.6], ddof=1) / np.sqrt(3)
    assert one["ci95"] == pytest.approx([one["mean_delta"] - half, one["mean_delta"] + half])
    assert one["sign_test_p"] == 1.0
    assert out[2, "x"]["better"] == 1 and out[2, "x"]["ci95"] is None  # one task: no interval
    assert (1, "lc") not in out
    by_x = paired_quality(rows, "context", reference="x")  # another reference: RAG, say
    assert by_x[1, "lc"]["mean_delta"] == pytest.approx(-one["mean_delta"])
    assert (by_x[1, "lc"]["better"], by_x[1, "lc"]["worse"]) == (1, 1) and (1, "x") not in by_x


def test_paired_quality_averages_a_tasks_seeds_before_counting_it():
    rows = [
        {"context": 1, "task": t, "seed": seed, "method": m, "quality": q}
        for t, seed, m, q in [
            ("a", 0, "lc", 0.0), ("a", 1, "lc", 1.0), ("a", 0, "x", 1.0), ("a", 1, "x", 1.0),
            ("b", 0, "lc", 1.0), ("b", 1, "lc", 0.0), ("b", 0, "x", 0.0), ("b", 1, "x", 1.0),
        ]
    ]  # fmt: skip
    one = paired_quality(rows, "context")[1, "x"]  # a: +1 and 0 -> +0.5; b: -1 and +1 -> 0
    assert (one["tasks"], one["better"], one["worse"], one["tied"]) == (2, 1, 0, 1)
    assert one["mean_delta"] == pytest.approx(0.25)
