"""The Fig. 8 scheduling simulator (benchmarks.dragon_sched): closed forms, the scheduler's
choice on a lopsided trace, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.dragon_sched import (
    STRATEGIES,
    DecodeTimes,
    Network,
    SimConfig,
    Simulation,
    Trace,
    bootstrap_traces,
    recording_from_latency,
    simulate,
    whole_traces,
)
from tandem.protocols.dragon.scheduler import synchronized_latency

TOKENS = 40


def constant_trace(device: bool, cloud: bool, n: int = TOKENS) -> Trace:
    return Trace({"device": (device,) * n, "cloud": (cloud,) * n})


def still(rtt: float) -> Network:
    return Network(base_rtt_s=rtt, extra_s=0.0, noise_s=0.0)


@pytest.mark.parametrize("c_device, c_cloud", [(0.3, 0.1), (0.1, 0.25), (0.2, 0.2)])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_zero_rtt_and_accepted_drafts_cost_the_slower_decoder_per_token(
    strategy, c_device, c_cloud
):
    result = simulate(
        constant_trace(True, True), DecodeTimes.constant(c_device, c_cloud), still(0.0), strategy,
        SimConfig(tokens=TOKENS),
    )  # fmt: skip
    assert result.per_token == pytest.approx([max(c_device, c_cloud)] * TOKENS)
    assert result.total_s == pytest.approx(TOKENS * max(c_device, c_cloud))


@pytest.mark.parametrize("rtt", [0.05, 0.2, 0.6])
def test_both_rejected_costs_table_1_per_token(rtt):
    """Paper Table 1, reject/reject: max(c_l, c_trans_l + c_trans_r + c_r) with l aggregating.
    On the cloud the device also waits one one-way trip for each token, same period."""
    c_device, c_cloud = 0.3, 0.1
    decode = DecodeTimes.constant(c_device, c_cloud)
    config = SimConfig(tokens=TOKENS)
    device = simulate(constant_trace(False, False), decode, still(rtt), "device", config)
    cloud = simulate(constant_trace(False, False), decode, still(rtt), "cloud", config)
    assert device.per_token[1:] == pytest.approx([max(c_device, rtt + c_cloud)] * (TOKENS - 1))
    assert cloud.per_token[1:] == pytest.approx([max(c_cloud, rtt + c_device)] * (TOKENS - 1))
    # the first drafts start together at t = 0; only the peer's first trip is paid
    assert device.per_token[0] == pytest.approx(max(c_device, c_cloud + rtt / 2))
    assert cloud.per_token[0] == pytest.approx(max(c_cloud, c_device + rtt / 2) + rtt / 2)


def test_a_lookahead_shorter_than_a_round_trip_stalls_the_drafting_side():
    """Every draft accepted, the cloud aggregating, 0.6 s round trips, 40 ms decodes: the device
    may draft only `lookahead` positions past the last target it knows, so with 8 it drafts 8
    tokens per round trip plus a decode (the cloud waits for each of its drafts), with 32 it
    keeps up and the per-token time falls to the decode's."""
    c, rtt, n = 0.04, 0.6, 120
    decode = DecodeTimes.constant(c, c)
    per_token = {
        ahead: simulate(
            constant_trace(True, True, n), decode, still(rtt), "cloud",
            SimConfig(tokens=n, lookahead=ahead),
        ).per_token
        for ahead in (8, 32)
    }  # fmt: skip
    steady = {ahead: float(np.mean(times[40:])) for ahead, times in per_token.items()}
    assert steady[8] == pytest.approx((rtt + c) / 8, rel=0.05)
    assert steady[32] == pytest.approx(c, rel=0.05)


@pytest.mark.parametrize("rtt", [0.05, 0.4])
def test_lookahead_one_on_the_device_is_token_wise_synchronisation(rtt):
    """docs/dragon.md: DRDG/TW has DRAGON's timing with lookahead 1 and the device aggregating."""
    decode = DecodeTimes.constant(0.15, 0.1)
    result = simulate(
        constant_trace(True, True),
        decode,
        still(rtt),
        "device",
        SimConfig(tokens=TOKENS, lookahead=1),
    )
    assert result.per_token[1:] == pytest.approx(
        [synchronized_latency(0.15, 0.1, rtt)] * (TOKENS - 1)
    )


@pytest.mark.parametrize("rejected", ["device", "cloud"])
def test_dragon_is_never_much_worse_than_the_best_fixed_side(rejected):
    """One side's drafts always rejected on a slow network: the aggregator belongs on that
    side (Eq. 8); the scheduler finds it after the first token."""
    trace = constant_trace(rejected != "device", rejected != "cloud", 100)
    decode = DecodeTimes(
        {"device": np.array([0.08, 0.1, 0.12]), "cloud": np.array([0.09, 0.1, 0.11])}
    )
    net = Network(base_rtt_s=0.5, extra_s=0.0, noise_s=0.02, seed=3)
    config = SimConfig(tokens=100)
    totals = {s: simulate(trace, decode, net, s, config, seed=7).total_s for s in STRATEGIES}
    best_fixed = min(totals["device"], totals["cloud"])
    assert totals["dragon"] <= 1.05 * best_fixed, totals
    assert totals[rejected] == best_fixed  # the sanity of the setting itself
    assert totals["dragon"] < 0.5 * max(totals["device"], totals["cloud"])


def test_the_pipelined_model_keeps_the_device_aggregating_where_eq7_hands_over():
    """Cloud 10x faster, 30% of its drafts rejected, every device draft accepted, 200 ms round
    trips: a rejected cloud redrafts and catches up within the device's decode (both draft
    ahead), so the device is the best place; Eq. 7 charges each cloud rejection the round
    trip and moves the aggregator to the cloud, where every token also reaches the device a
    one-way trip later."""
    n = 64
    trace = Trace(
        {"device": (True,) * n, "cloud": tuple(i % 10 not in (2, 5, 8) for i in range(n))}
    )
    decode = DecodeTimes.constant(0.08, 0.008)
    totals = {}
    for model in ("pipelined", "eq7"):
        config = SimConfig(tokens=n, scheduler_model=model)
        totals[model] = {
            s: simulate(trace, decode, still(0.2), s, config, seed=1) for s in STRATEGIES
        }
    pipelined, eq7 = totals["pipelined"], totals["eq7"]
    assert pipelined["device"].total_s < pipelined["cloud"].total_s  # the setting's sanity
    assert pipelined["dragon"].switches == 0
    assert pipelined["dragon"].total_s == pytest.approx(pipelined["device"].total_s)
    assert eq7["dragon"].switches == 1
    assert eq7["dragon"].total_s > 1.01 * eq7["device"].total_s


def test_replayed_whole_the_scheduler_follows_each_answer():
    """Two answers, one where the cloud's drafts fail (40%), one where the device's do; the
    cloud decodes 2x faster, 400 ms round trips. Each fixed placement is right for one answer;
    the scheduler learns each answer's side within a few tokens and beats the best fixed
    placement by far more than 5% over the two, replayed whole (`whole_traces`)."""
    n = 64
    fails = tuple(i % 5 not in (1, 3) for i in range(n))
    answers = [
        Trace({"device": (True,) * n, "cloud": fails}),
        Trace({"device": fails, "cloud": (True,) * n}),
    ]
    traces = whole_traces(answers, count=4, tokens=n)
    assert traces == answers * 2
    decode = DecodeTimes.constant(0.08, 0.04)
    totals = {
        s: sum(simulate(t, decode, still(0.4), s, SimConfig(tokens=n), seed=i).total_s
               for i, t in enumerate(traces))
        for s in STRATEGIES
    }  # fmt: skip
    assert totals["dragon"] < 0.95 * min(totals["device"], totals["cloud"]), totals


def test_the_replay_starts_where_the_cloud_places_the_first_aggregator():
    """The replay's cloud picks the first aggregator at READY as the live one does
    (`Scheduler.first`): with the device 2x faster at 400 ms it starts on the cloud, the
    place of the best fixed placement here, and pays no switch's trip to get there; with the
    cloud 2x faster it starts on the device."""
    n = 64
    fails = tuple(i % 5 not in (1, 3) for i in range(n))
    trace = Trace({"device": fails, "cloud": fails})
    config = SimConfig(tokens=n)
    for c_device, c_cloud, first in ((0.04, 0.08, "cloud"), (0.08, 0.04, "device")):
        decode = DecodeTimes.constant(c_device, c_cloud)
        sim = Simulation(trace, decode, still(0.4), "dragon", config, seed=2)
        assert sim.first_aggregator == first
        assert {m.aggregator for m in sim.machines.values()} == {first}
        totals = {s: simulate(trace, decode, still(0.4), s, config, seed=2) for s in STRATEGIES}
        assert totals["dragon"].switches == 0
        assert totals["dragon"].total_s == pytest.approx(totals[first].total_s)
        assert totals[first].total_s <= totals["cloud" if first == "device" else "device"].total_s


def test_whole_traces_cut_runs_and_refuse_more_tokens_than_the_shortest_has():
    runs = [
        Trace(
            {"device": (True, False, True), "cloud": (False,) * 3},
            {"device": (0.9, 0.1, 0.8), "cloud": (0.2,) * 3},
        ),
        Trace(
            {"device": (True,) * 5, "cloud": (True,) * 5},
            {"device": (1.0,) * 5, "cloud": (1.0,) * 5},
        ),
    ]
    cut = whole_traces(runs, count=3, tokens=2)
    assert [len(t) for t in cut] == [2, 2, 2]
    assert cut[0].accepted["device"] == (True, False) and cut[0].rates["device"] == (0.9, 0.1)
    assert cut[2] == cut[0] and cut[1].accepted["cloud"] == (True, True)
    with pytest.raises(ValueError, match="shortest recorded run has 3"):
        whole_traces(runs, count=1, tokens=4)


def latency_result() -> dict:
    """A `tandem bench dragon latency` result in miniature: a baseline without resolutions and
    one DRAGON method at two delays (greedy: the rates are the 0/1 outcomes)."""

    def dragon_run(question, delay, device):
        rows = [
            {"position": i, "by": "device", "aggregated": True, "device": ok, "cloud": True,
             "rate_device": float(ok), "rate_cloud": 1.0}
            for i, ok in enumerate(device)
        ]  # fmt: skip
        rows.insert(1, {**rows[0], "aggregated": False})  # the side that did not aggregate
        return {"method": "dragon-side-static-mirror", "delay_ms": delay, "question": question,
                "resolutions": rows, "per_token_s": 0.08,
                "decode_times": {"device": [[100, 0.08]] * 3, "cloud": [[100, 0.04]] * 3}}  # fmt: skip

    runs = [{"method": "crcg-device", "delay_ms": 0.0, "question": 0, "per_token_s": 0.08}]
    for delay in (300.0, 0.0):
        runs += [dragon_run(0, delay, [True] * 12), dragon_run(1, delay, [False, True] * 6)]
    return {"setup": {"model": "m", "temperature": 0.0}, "machines": {"cpus": {}}, "runs": runs}


def test_a_latency_result_is_a_recording_of_the_live_form():
    recording = recording_from_latency(latency_result())
    assert recording["source"] == {"method": "dragon-side-static-mirror", "delay_ms": 0.0}
    assert [r["question"] for r in recording["runs"]] == [0, 1]
    second = recording["runs"][1]
    assert second["accepted"]["device"] == [False, True] * 6  # aggregated rows only
    assert "rates" not in second  # greedy: the tracker learns the 0/1 outcomes
    assert recording["temperature"] == 0.0 and recording["machines"] == {"cpus": {}}
    sampled = latency_result()
    sampled["setup"]["temperature"] = 0.7
    for run in sampled["runs"][1:]:
        for row in run["resolutions"]:
            row["rate_device"] = 0.25
    rated = recording_from_latency(sampled)["runs"][1]
    assert rated["rates"] == {"device": [0.25] * 12, "cloud": [1.0] * 12}
    with pytest.raises(ValueError, match="no DRAGON run"):
        recording_from_latency({"runs": [{"method": "crcg-device", "delay_ms": 0.0}]})


def test_mirroring_makes_the_placement_latency_neutral():
    """With the live default (`mirror`), each side resolves a position once it holds both
    drafts, wherever the aggregator is, so every strategy gives the device the same token times
    on the same replay; without it (the paper's protocol) the placement shows."""
    recorded = [
        Trace({"device": tuple(np.arange(40) % 5 > 0), "cloud": tuple(np.arange(40) % 3 > 0)})
    ]
    trace = bootstrap_traces(recorded, count=1, tokens=60, block=10, seed=2)[0]
    decode = DecodeTimes({"device": np.array([0.05, 0.08, 0.1]), "cloud": np.array([0.01, 0.02])})
    net = Network(base_rtt_s=0.01, extra_s=0.3, noise_s=0.02, seed=4, phase=0.5)
    times = {
        mirror: {
            s: simulate(trace, decode, net, s, SimConfig(tokens=60, mirror=mirror), seed=9)
            for s in STRATEGIES
        }
        for mirror in (False, True)
    }
    mirrored = times[True]
    assert all(r.token_times == mirrored["device"].token_times for r in mirrored.values())
    assert mirrored["random"].switches > 0  # the aggregator did move
    paper = {s: r.total_s for s, r in times[False].items()}
    assert len(set(paper.values())) > 1, paper
    assert mirrored["device"].total_s <= min(paper.values()) + 1e-9


def test_same_seed_same_replay_other_seed_other_replay():
    recorded = [
        Trace({"device": tuple(np.arange(30) % 3 > 0), "cloud": tuple(np.arange(30) % 4 == 0)})
    ]
    traces = bootstrap_traces(recorded, count=3, tokens=50, block=10, seed=1)
    assert traces == bootstrap_traces(recorded, count=3, tokens=50, block=10, seed=1)
    assert all(len(t) == 50 for t in traces)
    decode = DecodeTimes({"device": np.array([0.1, 0.2, 0.3]), "cloud": np.array([0.05, 0.4])})
    net = Network(base_rtt_s=0.01, extra_s=0.2, noise_s=0.01, seed=5, phase=1.0)
    config = SimConfig(tokens=50)
    for strategy in ("random", "dragon"):
        one = simulate(traces[0], decode, net, strategy, config, seed=11)
        two = simulate(traces[0], decode, net, strategy, config, seed=11)
        other = simulate(traces[0], decode, net, strategy, config, seed=12)
        assert one.token_times == two.token_times
        assert one.token_times != other.token_times


def test_cli_replays_a_recording_without_a_model(tmp_path):
    import json

    import typer
    from typer.testing import CliRunner

    from benchmarks.cli.dragon_quality import perplexity, scheduling

    app = typer.Typer()
    app.command("perplexity")(perplexity)
    app.command("scheduling")(scheduling)
    run = {
        "question": "q",
        "accepted": {"device": [True, False] * 10, "cloud": [True, True, False, True] * 5},
        "decode_times": {"device": [[100, 0.1]] * 6, "cloud": [[100, 0.05], [101, 0.07]] * 3},
        "mean_per_token_s": 0.1,
    }
    recording = {"model": "m", "cloud_model": "m", "temperature": 0.7, "runs": [run, run]}
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(recording))
    args = ["scheduling", "--recording", str(path), "--traces", "3", "--tokens", "20"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    payload = json.loads((tmp_path / "dragon_sched.json").read_text())
    from tandem.protocols.dragon import DragonConfig

    assert payload["config"]["sim"]["lookahead"] == DragonConfig().lookahead  # the live default
    cell = payload["summary"]["as measured"]["0.2"]
    assert set(STRATEGIES) <= set(cell) and cell["dragon_vs_best_other"] > 0
    assert payload["recording"]["acceptance_rate"]["device"] == pytest.approx(0.5)
    assert (tmp_path / "dragon_sched.png").is_file()
    eight = CliRunner().invoke(
        app, [*args, "--lookahead", "8", "--name", "l8", "--out", str(tmp_path)]
    )
    assert eight.exit_code == 0, eight.output
    assert json.loads((tmp_path / "l8.json").read_text())["config"]["sim"]["lookahead"] == 8
    seeded = CliRunner().invoke(app, [*args, "--seed", "1", "--name", "s1", "--out", str(tmp_path)])
    assert seeded.exit_code == 0, seeded.output
    other = json.loads((tmp_path / "s1.json").read_text())
    assert other["config"]["seed"] == 1 and payload["config"]["seed"] == 0
    assert other["summary"] != payload["summary"]  # other traces, jitter and decode draws
    bad = CliRunner().invoke(app, ["perplexity", "--split", "nope", "--out", str(tmp_path)])
    assert bad.exit_code != 0 and "split" in str(bad.exception)
    # a latency result replayed whole, with the paper's Eq. 7
    latency = tmp_path / "latency.json"
    latency.write_text(json.dumps(latency_result()))
    whole = ["scheduling", "--recording", str(latency), "--whole-runs", "--traces", "4"]
    done = CliRunner().invoke(
        app, [*whole, "--scheduler-model", "eq7", "--name", "w", "--out", str(tmp_path)]
    )
    assert done.exit_code == 0, done.output
    replayed = json.loads((tmp_path / "w.json").read_text())
    assert replayed["config"]["tokens"] == 12  # the shortest run
    assert (
        replayed["config"]["whole_runs"] and replayed["config"]["sim"]["scheduler_model"] == "eq7"
    )
    assert replayed["recording"]["source"]["file"] == str(latency)
    assert replayed["recording"]["scheduler_learns"] == "0/1 outcomes"  # greedy
    assert "replayed whole" in replayed["traces"]
    assert payload["config"]["sim"]["scheduler_model"] == "pipelined"  # the live default
    for extra, message in (
        (["--tokens", "13"], "shortest recorded run (12 positions)"),
        (["--scheduler-model", "fastest"], "--scheduler-model must be one of"),
    ):
        refused = CliRunner().invoke(app, [*whole, *extra, "--out", str(tmp_path)])
        assert refused.exit_code != 0 and message in str(refused.exception), refused.output
    missing = CliRunner().invoke(
        app, ["scheduling", "--recording", str(tmp_path / "nope.json"), "--out", str(tmp_path)]
    )
    assert missing.exit_code != 0 and "no recording at" in str(missing.exception)
    stray = tmp_path / "stray.json"
    stray.write_text(json.dumps({"runs": [{"method": "crcg-device", "delay_ms": 0.0}]}))
    refused = CliRunner().invoke(
        app, ["scheduling", "--recording", str(stray), "--out", str(tmp_path)]
    )
    assert refused.exit_code != 0 and "not a recording" in str(refused.exception)


def test_recorded_rates_feed_the_scheduler_and_survive_the_bootstrap():
    """The live tracker learns Eq. 5's rates, not 0/1; a trace that recorded them replays them
    (`ReplayRule`), aligned with the outcomes through the block bootstrap."""
    from benchmarks.dragon_sched import Simulation

    n = 40
    accepted = {"device": (True,) * n, "cloud": tuple(i % 2 == 0 for i in range(n))}
    rates = {"device": (0.95,) * n, "cloud": tuple(0.5 + i / 100 for i in range(n))}
    trace = Trace(accepted, rates)
    (boot,) = bootstrap_traces([trace], count=1, tokens=30, block=10, seed=2)
    for side in ("device", "cloud"):
        by_rate = dict(zip(rates[side], accepted[side], strict=True))
        pairs = zip(boot.rates[side], boot.accepted[side], strict=True)
        assert all(by_rate[r] == a for r, a in pairs)
    decode = DecodeTimes.constant(0.1, 0.1)
    for use, cloud_alpha in ((True, 0.5 + (n - 1) / 100), (False, 0.0)):
        sim = Simulation(trace, decode, still(0.01), "device", SimConfig(tokens=n,
                         acceptance_ema=1.0, recorded_rates=use))  # fmt: skip
        sim.run()
        alpha = sim.machines["device"].tracker.alpha()
        assert alpha["cloud"] == pytest.approx(cloud_alpha)  # ema 1: the last rate, as is
        assert alpha["device"] == pytest.approx(0.95 if use else 1.0)
