"""`tandem bench humaneval-traces`: the target's greedy tokens, the draft's teacher-forced view
of them (agreement, rank, confidence), the pooled summary, and a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import humaneval_traces as traces
from tandem.models.registry import load_model


@pytest.fixture(scope="module")
def pair():
    return load_model("tiny-qwen2", progress=False), load_model("tiny-qwen2-b", progress=False)


def test_target_greedy_is_the_argmax_path_of_a_full_forward(pair):
    target, _ = pair
    ids = [5, 9, 2, 7]
    tokens = traces.target_greedy(target, ids, 6)
    assert len(tokens) == 6
    for i, token in enumerate(tokens):  # each token is the argmax on the prefix before it
        state = target.prefill(ids + tokens[:i])
        assert token == int(state.logits[0].argmax())


def test_teacher_forced_view_matches_one_prefill_per_position(pair):
    target, draft = pair
    ids = [3, 1, 4, 1, 5]
    tokens = traces.target_greedy(target, ids, 5)
    view = traces.teacher_forced(draft, ids, tokens)
    for i, token in enumerate(tokens):
        logits = draft.prefill(ids + tokens[:i]).logits[0].float()
        assert view["agree"][i] == int(int(logits.argmax()) == token)
        assert view["rank"][i] == int((logits > logits[token]).sum())
        assert view["top_prob"][i] == pytest.approx(
            float(torch.softmax(logits, -1).max()), abs=1e-3
        )
        assert (view["rank"][i] == 0) >= bool(view["agree"][i])  # agreeing means rank 0


def test_the_draft_agrees_with_itself_everywhere(pair):
    target, _ = pair
    ids = [2, 7, 1, 8]
    view = traces.teacher_forced(target, ids, traces.target_greedy(target, ids, 4))
    assert view["agree"] == [1, 1, 1, 1] and view["rank"] == [0, 0, 0, 0]


def test_summary_pools_positions_and_bands_problems():
    records = {
        "HumanEval/0": {"agree": [1, 1, 1, 0], "rank": [0, 0, 0, 1], "top_prob": [0.9, 0.8, 0.7, 0.4]},
        "HumanEval/1": {"agree": [1, 0, 0, 1, 1, 1, 1, 1, 1, 1], "rank": [0, 3, 9, 0, 0, 0, 0, 0, 0, 0],
                        "top_prob": [0.9] * 10},
        "HumanEval/2": {"agree": [1, 1], "rank": [0, 0], "top_prob": [1.0, 1.0]},
    }  # fmt: skip
    s = traces.summarize(records)
    assert s["positions"] == 16 and s["disagreements"] == 3
    assert s["agreement"] == pytest.approx(13 / 16)
    assert s["target_is_draft_second_choice"] == pytest.approx(1 / 3)
    assert s["target_in_draft_top5"] == pytest.approx(2 / 3)
    assert s["draft_top_prob_mean_where_disagree"] == pytest.approx((0.4 + 0.9 + 0.9) / 3)
    assert s["bands"]["[0.7, 0.8)"] == ["HumanEval/0"]  # 0.75
    assert s["bands"]["[0.8, 0.9)"] == ["HumanEval/1"]  # 0.8 falls in the upper band
    assert s["bands"]["[0.9, 1.0]"] == ["HumanEval/2"]  # 1.0 counts in the last band
    assert sum(s["problems_per_band"].values()) == 3


def test_tiny_run_writes_traces_spec_paper_can_read(tmp_path):
    from benchmarks.spec_paper import load_traces

    traces.run(problems="0-1", max_new_tokens=5, device_model="tiny-qwen2-b",
               cloud_model="tiny-qwen2", out=tmp_path, name="t")  # fmt: skip
    saved = json.loads((tmp_path / "t.json").read_text())
    assert (tmp_path / "t.png").stat().st_size > 0
    assert list(saved["draft_agreement_teacher_forced"]) == ["HumanEval/0", "HumanEval/1"]
    for task, agree in saved["draft_agreement_teacher_forced"].items():
        assert len(agree) == len(saved["target_tokens"][task]) == len(saved["draft_rank"][task])
    assert saved["summary"]["problems"] == 2
    assert len(load_traces(tmp_path / "t.json", (), 1)["humaneval"]) == 2
