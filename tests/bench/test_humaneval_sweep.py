"""`tandem bench humaneval-sweep`: ratios, adaptive vs the best fixed mode, the Eq. 9 check."""

from __future__ import annotations

import json

import pytest

from benchmarks.humaneval_sweep import run, summarize
from tandem.errors import TandemError
from tandem.protocols.spec.planner import Costs, throughput


def _run(mode, tpot, *, drafted=0, t_draft=0.0, t_verify=0.0, plan=None):
    row = {"mode": mode, "tpot_ms": tpot, "drafted": drafted, "t_draft_token_ms": t_draft,
           "t_verify_ms": t_verify}  # fmt: skip
    if plan:
        row["plan_after"] = plan
    return row


def payload(rtt: float = 100.0) -> dict:
    def row(mode, tok_s, acceptance=None):
        return {"mode": mode, "tokens_per_s": tok_s, "pass_at_1": 0.5,
                "acceptance_rate": acceptance}  # fmt: skip

    return {
        "setup": {"rtt_ms": rtt, "draft_len": 4},
        "table": [
            row("ar", 7.0),
            row("local", 14.0),
            row("spec-async", 6.0, 0.9),
            row("spec-eager", 6.5, 0.9),
            row("spec-adaptive", 6.86),
        ],  # fmt: skip
        "runs": [
            _run("ar", 100.0),
            _run("ar", 100.0),
            _run("local", 50.0),
            _run("spec-async", 110.0, drafted=40, t_draft=50.0, t_verify=400.0),
            _run("spec-eager", 90.0, drafted=40, t_draft=50.0, t_verify=380.0),
            _run("spec-adaptive", 95.0, plan={"method": "ar", "gamma": 0}),
        ],  # fmt: skip
    }


def test_summary_ratios_and_the_eq9_prediction():
    record = summarize(payload())
    modes = record["modes"]
    assert modes["ar"]["decode_tok_s"] == pytest.approx(10.0)
    assert modes["spec-async"]["speedup_vs_cloud_ar"] == pytest.approx(6.0 / 7.0)
    assert modes["local"]["speedup_vs_device_only"] == pytest.approx(1.0)
    assert record["best_fixed"] == "ar"
    assert record["adaptive_vs_best_fixed"] == pytest.approx(0.98)
    assert record["adaptive_last_plan"] == {"method": "ar", "gamma": 0}
    costs = Costs.from_points(t_draft=0.05, t_ar=0.1, t_block=0.4, block=4, rtt=0.1)
    eq9 = record["eq9"]["per_mode"]
    assert eq9["ar"]["model_error"] == pytest.approx(0.0)
    expected = throughput("async", 0.9, 4, costs)
    assert eq9["spec-async"]["predicted_decode_tok_s"] == pytest.approx(expected)
    assert eq9["spec-async"]["model_error"] == pytest.approx(expected / (1000 / 110) - 1)


def test_run_writes_one_table_sorted_by_rtt(tmp_path):
    paths = []
    for rtt in (200.0, 0.0):
        path = tmp_path / f"h{rtt:g}.json"
        path.write_text(json.dumps(payload(rtt)))
        paths.append(path)
    result = run(paths, out=tmp_path, name="sweep")
    assert [r["rtt_ms"] for r in result["per_rtt"]] == [0.0, 200.0]
    assert (tmp_path / "sweep.json").is_file()
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TandemError, match="not a humaneval result"):
        run([tmp_path / "bad.json"], out=tmp_path)
    with pytest.raises(TandemError, match="one or more"):
        run([], out=tmp_path)


def test_the_epoch_model_is_priced_on_the_pass_line_fitted_to_the_clouds_passes():
    from tandem.protocols.spec import epochs

    data = payload()
    assert "epoch_model" not in summarize(data)  # older files: no passes recorded
    for run_ in data["runs"]:
        if run_["mode"] in ("spec-async", "spec-eager"):  # passes on the line 90 + 80 n ms
            run_["cloud_passes"] = {"drafts": [1, 3, 4, 4], "verify_ms": [170, 330, 410, 410],
                                    "ar_step_ms": []}  # fmt: skip
    record = summarize(data)
    check = record["epoch_model"]
    assert record["eq9"]["t_verify_block_ms"] == pytest.approx(90 + 80 * 4)  # not the mean
    assert check["pass_ms"] == pytest.approx({"no_drafts": 90.0, "per_draft": 80.0})
    costs = Costs(t_draft=0.05, decode_base=0.01, decode_per_token=0.08, rtt=0.1)
    for mode, pipeline in (("spec-async", "async"), ("spec-eager", "eager")):
        got = check["per_mode"][mode]
        assert got["predicted_decode_tok_s"] == pytest.approx(epochs.rate(pipeline, 0.9, 4, costs))
        assert got["model_error"] == pytest.approx(
            got["predicted_decode_tok_s"] / got["measured_decode_tok_s"] - 1
        )


def test_eager_branch_is_priced_with_the_rates_its_runs_counted():
    from tandem.protocols.spec import epochs
    from tandem.protocols.spec.planner import Branching

    data = payload()
    data["table"].append({"mode": "spec-eager-branch", "tokens_per_s": 6.9, "pass_at_1": 0.5,
                          "acceptance_rate": 0.9})  # fmt: skip
    counts = {"match": 45, "unsure_match": 9, "miss": 5, "unsure_miss": 4, "second": 3}
    data["runs"].append({**_run("spec-eager-branch", 85.0, drafted=40, t_draft=50.0),
                         "branches": {"opened": 6, "confidence": counts}})  # fmt: skip
    data["runs"].append({**_run("spec-eager-branch", 85.0, drafted=40, t_draft=50.0),
                         "branches": {"opened": 6, "confidence": counts}})  # fmt: skip
    for run_ in data["runs"]:
        if run_["mode"] in ("spec-async", "spec-eager"):
            run_["cloud_passes"] = {"drafts": [1, 4], "verify_ms": [170, 410], "ar_step_ms": []}
    record = summarize(data)
    assert record["best_fixed"] == "ar"  # 7.0 against eager-branch's 6.9: a fixed mode too
    got = record["epoch_model"]["per_mode"]["spec-eager-branch"]
    branching = Branching(unsure_match=0.2, unsure_miss=0.8, second=0.75, length=4)
    assert got["branching"] == pytest.approx(
        {"unsure_match": 0.2, "unsure_miss": 0.8, "second": 0.75, "length": 4, "refeed_s": 0.0}
    )
    costs = Costs(t_draft=0.05, decode_base=0.01, decode_per_token=0.08, rtt=0.1)
    assert got["predicted_decode_tok_s"] == pytest.approx(
        epochs.branch_rate(0.9, 4, costs, branching)
    )
    assert got["model_error"] == pytest.approx(got["predicted_decode_tok_s"] / (1000 / 85) - 1)
    assert got["predicted_branch_gain"] == pytest.approx(
        epochs.branch_gain(0.9, 4, costs, branching)
    )
    for run_ in data["runs"]:  # no counts (branches off, older files): no branch check
        run_.pop("branches", None)
    assert "spec-eager-branch" not in summarize(data)["epoch_model"]["per_mode"]


def test_departures_from_ar_are_carried_and_margins_measured_where_the_run_had_none(tmp_path):
    from benchmarks import humaneval_tasks as tasks
    from tandem.models.registry import load_model

    data = payload()
    data["setup"].update(cloud_model="tiny-qwen2", problems=["HumanEval/0"])
    data["runs"] = [r for r in data["runs"] if r["mode"] != "ar"]  # one AR run, as recorded
    data["runs"].append({"mode": "ar", "problem": "HumanEval/0", "tokens": [5, 6, 7, 8],
                         "tpot_ms": 100.0, "drafted": 0, "t_draft_token_ms": 0.0,
                         "t_verify_ms": 0.0})  # fmt: skip
    measured = {"mode": "spec-eager", "problem": "HumanEval/0", "position": 1, "ar_token": 6,
                "mode_token": 9, "target_top2_margin": 0.5}  # fmt: skip
    unmeasured = {**measured, "position": 2, "ar_token": 7}
    del unmeasured["target_top2_margin"]
    data["exactness"] = {"per_mode": {"spec-eager": {"pass_at_1_equal_ar": False}},
                         "divergences": [measured, unmeasured]}  # fmt: skip
    path = tmp_path / "h.json"
    path.write_text(json.dumps(data))
    plain = run([path], out=tmp_path, name="plain")["per_rtt"][0]
    assert plain["exactness"] == {"spec-eager": {"pass_at_1_equal_ar": False}}
    assert "target_top2_margin" not in plain["divergences"][1]
    swept = run([path], out=tmp_path, name="m", margins=True)["per_rtt"][0]["divergences"]
    assert swept[0] == measured  # the run's own margin is kept as it was
    target = load_model("tiny-qwen2")
    prompt = next(p["prompt"] for p in tasks.load_problems() if p["task_id"] == "HumanEval/0")
    logits = target.prefill(target.tokenizer.encode(prompt) + [5, 6]).logits[0]
    top = logits.topk(2).values
    assert swept[1]["target_top2_margin"] == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert swept[1]["target_ar_minus_mode_logit"] == pytest.approx(
        float(logits[7] - logits[9]), abs=1e-4
    )
    assert json.loads(path.read_text()) == data  # the result file is never edited
