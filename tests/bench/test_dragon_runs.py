"""`tandem bench dragon runs`: ratios and their spread, derived from latency result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.cli.dragon import app
from benchmarks.dragon_runs import describe, ratios, summarize
from benchmarks.dragon_timeline import cycles, stalls

MIRROR = "dragon-side-static-mirror"


def latency_result(delayed, per_token_ms, loads=None):
    """A latency result file's shape: `per_token_ms` maps (method, delay) -> ms."""
    table = [
        {"method": m, "delay_ms": d, "per_token_s": ms / 1e3, "ttft_s": 0.5}
        for (m, d), ms in per_token_ms.items()
    ]
    runs = [
        {"delay_ms": d, "method": m, "load_1min": load} for (m, d), load in (loads or {}).items()
    ]
    setup = {"questions": ["q"] * 16, "max_new_tokens": 64, "delayed": delayed}
    if delayed is None:  # files made before the switch
        del setup["delayed"]
    return {"environment": {"time": "t"}, "setup": setup, "table": table, "runs": runs}


def test_ratio_per_delay_where_both_methods_ran():
    payload = latency_result(
        "down",
        {("crcg-device", 0.0): 34.0, (MIRROR, 0.0): 37.4, ("dragon", 0.0): 90.0,
         ("crcg-device", 300.0): 35.0, ("dragon", 300.0): 99.0},
        loads={("crcg-device", 0.0): 1.0, (MIRROR, 0.0): 2.0},
    )  # fmt: skip
    rows = ratios(payload)
    assert len(rows) == 1  # +300 has no mirrored run
    assert rows[0]["ratio"] == pytest.approx(1.1)
    assert (rows[0]["crcg_device_ms"], rows[0]["method_ms"]) == pytest.approx((34.0, 37.4))
    assert rows[0]["load_1min"] == pytest.approx(1.5)
    assert ratios(payload, "dragon")[1]["ratio"] == pytest.approx(99.0 / 35.0)


def test_spread_per_setting_and_delay_and_the_targets():
    both = latency_result(
        None,
        {
            ("crcg-device", 0.0): 10.0,
            (MIRROR, 0.0): 10.8,
            ("crcg-device", 300.0): 10.0,
            (MIRROR, 300.0): 13.0,
        },
    )
    down = latency_result(
        "down",
        {
            ("crcg-device", 0.0): 10.0,
            (MIRROR, 0.0): 11.4,
            ("crcg-device", 300.0): 10.0,
            (MIRROR, 300.0): 11.9,
        },
    )
    down2 = latency_result("down", {("crcg-device", 0.0): 10.0, (MIRROR, 0.0): 11.0,
                                    ("crcg-device", 300.0): 10.0, (MIRROR, 300.0): 12.2})  # fmt: skip
    runs = [describe(Path(p), payload) for p, payload in
            (("a.json", both), ("b.json", down), ("c.json", down2))]  # fmt: skip
    assert runs[0]["delayed"] == "both"  # the only setting before the switch
    summary = {(g["delayed"], g["delay_ms"]): g for g in summarize(runs)}
    assert set(summary) == {("-", 0.0), ("both", 300.0), ("down", 300.0)}
    zero = summary[("-", 0.0)]  # no delay: every run counts, whatever its setting
    assert zero["runs"] == 3 and zero["median"] == pytest.approx(1.10)
    assert (zero["min"], zero["max"]) == pytest.approx((1.08, 1.14))
    assert zero["met"] == 2  # 1.08 and 1.10 are <= 1.10x
    down300 = summary[("down", 300.0)]
    assert down300["runs"] == 2 and down300["met"] == 1
    assert down300["median"] == pytest.approx(1.205)
    assert summary[("both", 300.0)]["met"] == 0


def test_a_run_without_the_papers_jitter_is_a_setting_of_its_own():
    times = {("crcg-device", 0.0): 10.0, (MIRROR, 0.0): 11.0,
             ("crcg-device", 300.0): 10.0, (MIRROR, 300.0): 12.0}  # fmt: skip
    paper, control = latency_result("down", times), latency_result("down", times)
    paper["setup"]["jitter_fraction"] = 0.2
    control["setup"]["jitter_fraction"] = 0.0
    runs = [describe(Path(p), payload) for p, payload in
            (("old.json", latency_result("down", times)), ("p.json", paper), ("c.json", control))]  # fmt: skip
    assert [r["delayed"] for r in runs] == ["down", "down", "down, jitter 0"]
    summary = {(g["delayed"], g["delay_ms"]): g["runs"] for g in summarize(runs)}
    assert summary == {("-", 0.0): 3, ("down", 300.0): 2, ("down, jitter 0", 300.0): 1}


def test_cli_writes_the_table_and_refuses_files_it_cannot_use(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(latency_result("down", {("crcg-device", 0.0): 10.0,
                                                      (MIRROR, 0.0): 11.0})))  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, ["runs", str(good), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "o" / "dragon_runs.json").read_text())
    assert saved["summary"][0]["median"] == pytest.approx(1.1)
    assert saved["derived_from"] == [str(good)]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(latency_result("down", {("crcg-device", 0.0): 10.0})))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path, words in ((other, "no dragon-side-static-mirror beside crcg-device"),
                        (broken, "cannot read"), (tmp_path / "absent.json", "cannot read")):  # fmt: skip
        failed = runner.invoke(app, ["runs", str(path), "--out", str(tmp_path / "o2")])
        assert failed.exit_code != 0
        assert words in str(failed.exception) + failed.output


def verdicts(*rejected):
    """Resolutions of positions 0-11, every draft accepted but (position, side) in `rejected`."""
    return [
        {
            "position": t,
            "device": (t, "device") not in rejected,
            "cloud": (t, "cloud") not in rejected,
        }
        for t in range(12)
    ]


def test_the_two_chain_model_puts_a_stall_at_a_cloud_rejection_after_a_device_one():
    # level chains: a cloud rejection costs nothing; a device rejection puts the device's
    # chain behind, and the next cloud rejection (not a device one) costs the trip
    assert cycles(verdicts((1, "cloud"), (2, "device"), (4, "device"), (6, "cloud"),
                           (7, "cloud"))) == [6]  # fmt: skip
    # a target neither side drafted rejects both: behind if level, level again if behind
    both = verdicts((0, "device"), (0, "cloud"), (3, "device"), (3, "cloud"), (5, "cloud"))
    assert cycles(both) == [3]
    assert cycles(list(reversed(verdicts((9, "device"), (2, "cloud"), (10, "cloud"))))) == [10]
    assert cycles(verdicts()) == []


def test_stalls_split_a_runs_gaps_and_check_them_against_the_model():
    gaps_ms = [20, 20, 330, 20, 20, 20, 20, 20, 20, 20, 20]  # one stall, after position 2
    times = [0.5 + sum(gaps_ms[:i]) / 1e3 for i in range(12)]
    run = {"method": MIRROR, "delay_ms": 300.0, "token_times": times,
           "resolutions": verdicts((0, "device"), (2, "cloud"))}  # fmt: skip
    payload = latency_result("down", {("crcg-device", 300.0): 16.0, (MIRROR, 300.0): 50.0})
    payload["runs"] = [run, {**run, "method": "crcg-device"}]
    split = stalls(payload["runs"], MIRROR, 300.0, baseline_s=0.016)
    counts = (split["gaps"], split["stalls"], split["cycles"], split["stalls_at_cycles"])
    assert counts == (11, 1, 1, 1)
    assert split["paced_ms"] == pytest.approx(20.0)
    assert split["stall_ms_per_token"] == pytest.approx(330 / 11)
    assert split["paced_ratio"] == pytest.approx(20.0 / 16.0)
    assert stalls(payload["runs"], MIRROR, 300.0)["paced_ratio"] is None  # no baseline given
    row = ratios(payload)[0]
    assert row["stalls"]["paced_ratio"] == pytest.approx(20.0 / 16.0)
    assert summarize([{"delayed": "down", "rows": [row]}])[0]["paced_median"] == pytest.approx(1.25)
    # a model stall the run did not show, and a gap the model does not explain
    moved = {**run, "resolutions": verdicts((0, "device"), (5, "cloud"))}
    payload["runs"] = [moved]
    elsewhere = stalls(payload["runs"], MIRROR, 300.0)
    assert (elsewhere["stalls"], elsewhere["cycles"], elsewhere["stalls_at_cycles"]) == (1, 1, 0)
    # a short gap is no stall at +300 but one at +20 (three quarters of the delay: 15 ms)
    payload["runs"] = [{**run, "delay_ms": 20.0}]
    assert stalls(payload["runs"], MIRROR, 20.0)["stalls"] == 11
    # nothing to split: no delay, no token times; no model without resolutions
    assert stalls(payload["runs"], MIRROR, 0.0) is None
    payload["runs"] = [{**run, "token_times": []}]
    assert stalls(payload["runs"], MIRROR, 300.0) is None
    payload["runs"] = [{k: v for k, v in run.items() if k != "resolutions"}]
    unmodelled = stalls(payload["runs"], MIRROR, 300.0)
    assert unmodelled["stalls"] == 1 and unmodelled["cycles"] is None
    assert unmodelled["stalls_at_cycles"] is None
