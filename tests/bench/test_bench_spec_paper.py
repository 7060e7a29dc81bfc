"""`tandem bench spec-paper`: the trace-driven draft, the traces it reads, and a tiny run
(every method, exact output, the ratios and predictions in the JSON)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.spec_paper import (
    METHODS,
    RankedTraceDraftLM,
    TraceDraftLM,
    build_traces,
    exact_draw,
    load_traces,
    paper_target,
    parse_band,
    ranked_draw,
    ranked_pools,
    recorded_traces,
    run,
    trace_branching,
)
from tandem.errors import TandemError


def test_trace_draft_agrees_with_the_target_exactly_where_the_trace_says():
    target = paper_target()
    prompt = (1, 2, 3)
    agreement = [1, 0, 1, 0, 0, 1]
    draft = TraceDraftLM(target, agreement, len(prompt))
    context = prompt
    for position, agree in enumerate(agreement):
        same = int(draft.row(context).argmax()) == int(target.row(context).argmax())
        assert same == bool(agree), position
        context = context + (int(target.row(context).argmax()),)


def test_traces_come_from_the_humaneval_json_and_the_sweep(tmp_path):
    path = tmp_path / "he.json"
    path.write_text(json.dumps({"draft_agreement_teacher_forced": {"a": [1, 0, 1], "b": [1]}}))
    traces = load_traces(path, (0.5,), 3)
    assert traces["humaneval"] == [[1, 0, 1], [1]]
    assert len(traces["random-0.5"]) == 3 and all(len(t) == 128 for t in traces["random-0.5"])
    assert all(sum(t) == 64 for t in traces["random-0.5"])  # exactly the agreement asked for
    assert len({tuple(t) for t in traces["random-0.5"]}) == 3  # at different places
    assert "humaneval" not in load_traces(tmp_path / "missing.json", (0.5,), 1)


def test_a_band_keeps_the_recorded_problems_whose_agreement_lies_in_it(tmp_path):
    path = tmp_path / "he.json"
    recorded = {"a": [1, 1, 1, 0], "b": [1, 0, 1, 0], "c": [1] * 4, "d": [1, 1, 1, 1, 0], "e": []}
    path.write_text(json.dumps({"draft_agreement_teacher_forced": recorded}))
    traces = load_traces(path, (), 1, band=(0.7, 0.8))  # a: 0.75, d: 0.8 (inclusive)
    assert traces == {"humaneval-0.7-0.8": [[1, 1, 1, 0], [1, 1, 1, 1, 0]]}
    assert load_traces(path, (), 1, band=(0.3, 0.4)) == {}
    assert list(recorded_traces(path, (0.7, 0.8))) == ["a", "d"]  # the JSON names them
    assert parse_band("0.7-0.8") == (0.7, 0.8) and parse_band(None) is None


def test_problems_caps_the_recorded_traces_and_leaves_the_sweep_its_own_count(tmp_path):
    path = tmp_path / "he.json"
    recorded = {"a": [1, 0], "b": [1, 1], "c": [0, 1]}
    path.write_text(json.dumps({"draft_agreement_teacher_forced": recorded}))
    assert list(recorded_traces(path, problems=2)) == ["a", "b"]
    assert list(recorded_traces(path, (0.9, 1.0), problems=1)) == ["b"]  # the band first
    payload = run(out=tmp_path, humaneval=path, rtts=(20.0,), sweep=(0.5,), sweep_problems=2,
                  problems=1, max_new_tokens=4, methods=("cloud-ar",))  # fmt: skip
    per_trace = {t: {r["problem"] for r in payload["runs"] if r["trace"] == t} for t in
                 ("humaneval", "random-0.5")}  # fmt: skip
    assert per_trace == {"humaneval": {0}, "random-0.5": {0, 1}}


@pytest.mark.parametrize("text", ["0.8", "a-b", "0.9-0.7", "0.5-1.5"])
def test_a_bad_band_is_refused_with_a_message(text):
    with pytest.raises(TandemError, match="--band"):
        parse_band(text)


def test_exact_draws_agree_at_every_position_with_the_asked_probability():
    generator = torch.Generator().manual_seed(0)
    draws = torch.tensor([exact_draw(0.75, generator, length=8) for _ in range(4000)])
    assert (draws.sum(1) == 6).all()
    assert torch.allclose(draws.float().mean(0), torch.full((8,), 0.75), atol=0.03)


def test_tiny_run_writes_every_method_with_ratios(tmp_path):
    path = tmp_path / "he.json"
    path.write_text(json.dumps({"draft_agreement_teacher_forced": {"p": [1, 1, 0, 1] * 4}}))
    payload = run(out=tmp_path, humaneval=path, rtts=(20.0,), sweep=(), max_new_tokens=10)
    saved = json.loads((tmp_path / "spec_paper.json").read_text())
    assert saved["emulated"] is True and (tmp_path / "spec_paper.png").stat().st_size > 0
    assert {r["method"] for r in saved["table"]} == set(METHODS)
    outputs = {tuple(r["tokens_list"]) for r in payload["runs"]}
    assert len(outputs) == 1  # greedy: every method emits the target's greedy path
    for row in saved["table"]:
        assert row["speedup_vs_cloud_ar"] == pytest.approx(
            row["throughput_tok_s"]
            / next(r["throughput_tok_s"] for r in saved["table"] if r["method"] == "cloud-ar")
        )
        assert row["predicted_decode_tok_s"] > 0 and "speedup_vs_stop_and_wait" in row


def test_a_ranked_draft_puts_the_targets_token_at_its_rank_with_the_given_confidence():
    target = paper_target()
    prompt = (1, 2, 3)
    trace = [(1, 0, 0.9), (0, 1, 0.4), (0, 5, 0.2), (1, 0, 0.3), (0, 200, 0.6)]
    draft = RankedTraceDraftLM(target, trace, len(prompt))
    context = prompt
    for agree, rank, top in trace:
        row, best = draft.row(context), int(target.row(context).argmax())
        order = row.argsort(descending=True).tolist()
        assert order.index(best) == (0 if agree else min(rank, len(order) - 1))
        assert float(torch.softmax(row, -1).max()) == pytest.approx(top, abs=1e-3)
        context = context + (best,)


def test_ranked_traces_come_from_a_humaneval_traces_file(tmp_path):
    path = tmp_path / "t.json"
    data = {"draft_agreement_teacher_forced": {"a": [1, 0, 1, 0]},
            "draft_rank": {"a": [0, 1, 0, 3]}, "draft_top_prob": {"a": [0.9, 0.4, 0.8, 0.3]}}  # fmt: skip
    path.write_text(json.dumps(data))
    assert recorded_traces(path, ranked=True) == {
        "a": [(1, 0, 0.9), (0, 1, 0.4), (1, 0, 0.8), (0, 3, 0.3)]
    }
    pools = ranked_pools(path)
    assert pools == {0: [(1, 0.4), (3, 0.3)], 1: [(0, 0.9), (0, 0.8)]}
    trace = ranked_draw(0.75, pools, torch.Generator().manual_seed(0))
    assert len(trace) == 128 and sum(a for a, _, _ in trace) == 96
    assert all((r, t) in pools[a] for a, r, t in trace)
    traces = build_traces(recorded_traces(path, ranked=True), (0.75,), 2, None, pools)
    assert list(traces) == ["humaneval", "ranked-0.75"] and len(traces["ranked-0.75"]) == 2
    del data["draft_rank"]
    path.write_text(json.dumps(data))
    with pytest.raises(TandemError, match="--ranked needs draft_rank"):
        recorded_traces(path, ranked=True)


def test_branches_are_taken_on_ranked_traces_and_the_output_stays_the_targets(tmp_path):
    """Second choices hold the target's token where the trace says rank 1: eager-branch
    promotes branches there; every method's output is the target's greedy path."""
    path = tmp_path / "t.json"
    agree = [1, 1, 0, 1, 1, 1, 0, 1] * 3
    data = {"draft_agreement_teacher_forced": {"p": agree},
            "draft_rank": {"p": [0 if a else 1 for a in agree]},
            "draft_top_prob": {"p": [0.9 if a else 0.3 for a in agree]}}  # fmt: skip
    path.write_text(json.dumps(data))
    payload = run(out=tmp_path, humaneval=path, rtts=(40.0,), sweep=(), max_new_tokens=20,
                  methods=("eager", "eager-branch"), ranked=True)  # fmt: skip
    assert len({tuple(r["tokens_list"]) for r in payload["runs"]}) == 1
    branch = next(r for r in payload["runs"] if r["method"] == "eager-branch")
    assert branch["branches"]["promoted"] > 0
    assert payload["setup"]["ranked"] is True
    row = next(r for r in payload["table"] if r["method"] == "eager-branch")  # priced
    assert row["branching"] == {"unsure_match": 0.0, "unsure_miss": 1.0, "second": 1.0,
                                "length": 4, "refeed_s": pytest.approx(0.008)}  # fmt: skip
    assert row["predicted_epoch_decode_tok_s"] > 0


def test_trace_branching_counts_unsure_drafts_and_second_choices():
    ranked = [[(1, 0, 0.9), (1, 0, 0.4), (0, 1, 0.3), (0, 2, 0.2)], [(0, 1, 0.7), (1, 0, 0.8)]]
    b = trace_branching(ranked, 0.5, 3)
    assert (b.unsure_match, b.unsure_miss, b.second, b.length) == (1 / 3, 2 / 3, 0.5, 3)
    # agreement-only traces: the target's token is ranked last, never a second choice; the
    # toy target's rows (64 tokens, logits 2 N(0, 1)) are unsure more often once demoted
    plain = trace_branching([[1, 0, 1]], 0.5, 4)
    assert plain.second == 0.0 and 0.0 < plain.unsure_match < plain.unsure_miss <= 1.0
    assert trace_branching([[1, 0, 1]], 0.01, 4).unsure_match == 0.0
