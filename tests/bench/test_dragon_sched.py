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
    Trace,
    bootstrap_traces,
    simulate,
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
