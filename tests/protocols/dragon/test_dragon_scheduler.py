"""Scheduler math (paper Eq. 7/8, Theorem 6.2) and the strategies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.protocols.dragon.config import DragonConfig
from tandem.protocols.dragon.scheduler import (
    Estimates,
    Scheduler,
    expected_latency,
    latency_gap,
    latency_gap_piecewise,
    pipelined_gap,
    pipelined_latency,
    predicted_speedup,
    synchronized_latency,
)

seconds = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)
rates = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(seconds, seconds, rates, rates, st.floats(min_value=1e-3, max_value=2.0))
def test_piecewise_eq8_is_the_difference_of_eq7(c_l, c_r, a_l, a_r, rtt):
    assert latency_gap_piecewise(c_l, c_r, a_l, a_r, rtt) == pytest.approx(
        latency_gap(c_l, c_r, a_l, a_r, rtt), abs=1e-9
    )


@given(seconds, seconds, rates, st.floats(min_value=1e-3, max_value=2.0))
def test_theorem_6_2_is_synchronised_over_speculative_latency(c_l, c_r, a_r, rtt):
    speculative = expected_latency(c_l, c_r, a_r, rtt)
    if speculative > 0:
        assert predicted_speedup(c_l, c_r, a_r, rtt) == pytest.approx(
            synchronized_latency(c_l, c_r, rtt) / speculative, rel=1e-9
        )


def test_all_rejected_is_token_wise_synchronisation():
    assert expected_latency(0.2, 0.1, 0.0, 0.3) == synchronized_latency(0.2, 0.1, 0.3)
    assert predicted_speedup(0.2, 0.1, 0.0, 0.3) == pytest.approx(1.0)
    assert predicted_speedup(0.05, 0.1, 1.0, 0.3) == pytest.approx(4.0)  # rtt fully hidden


def estimates(c_device, c_cloud, a_device, a_cloud, rtt):
    return Estimates(
        c_dec={"device": c_device, "cloud": c_cloud},
        alpha={"device": a_device, "cloud": a_cloud},
        rtt=rtt,
    )


def test_dragon_moves_the_aggregator_away_from_the_side_whose_drafts_pass():
    """Paper Fig. 9: c_cloud < c_device <= c_cloud + rtt, device drafts accepted, cloud drafts
    rejected: aggregating on the cloud hides the round trip, so the device hands over."""
    scheduler = Scheduler("dragon")
    switch = scheduler.decide("device", 0, estimates(0.3, 0.2, 1.0, 0.0, 0.5))
    assert switch.aggregator == "cloud" and switch.gap > 0
    stay = scheduler.decide("device", 0, estimates(0.3, 0.2, 0.0, 1.0, 0.5))
    assert stay.aggregator == "device" and stay.gap < 0
    # the bottleneck side keeps the aggregator whatever the acceptance (Sec. 5.1)
    for a_device, a_cloud in ((0.0, 0.0), (1.0, 0.0), (0.3, 0.9)):
        assert (
            scheduler.decide("device", 0, estimates(2.0, 0.1, a_device, a_cloud, 0.5)).aggregator
            == "device"
        )


def test_margin_and_missing_estimates_keep_the_aggregator():
    assert Scheduler("dragon").decide("cloud", 3, None).aggregator == "cloud"
    tight = estimates(0.3, 0.2, 1.0, 0.0, 0.5)
    gap = Scheduler("dragon").decide("device", 0, tight).gap
    assert Scheduler("dragon", margin=gap + 1e-6).decide("device", 0, tight).aggregator == "device"


def test_a_switch_horizon_prices_the_one_way_trip_a_switch_costs():
    """With horizon H the aggregator moves only when the gap exceeds rtt / 2 / H (the switch's
    one-way trip repaid within H tokens); H = 0 is the paper's rule (any positive gap)."""
    # the cloud decodes 2x faster, its drafts pass less often: a small gap for it under
    # either model
    for model, near in (
        ("eq7", estimates(0.11, 0.055, 0.90, 0.85, 0.4)),
        ("pipelined", estimates(0.11, 0.055, 0.90, 0.75, 0.4)),
    ):
        gap = Scheduler("dragon", model=model).decide("device", 0, near).gap
        assert 0 < gap < 0.05
        price_horizon = 0.2 / gap  # rtt / 2 / H == gap
        stay, move = int(price_horizon) - 1, int(price_horizon) + 1
        assert stay >= 1
        for horizon, side in ((0, "cloud"), (move, "cloud"), (stay, "device")):
            scheduler = Scheduler("dragon", horizon=horizon, model=model)
            assert scheduler.decide("device", 0, near).aggregator == side
        # the larger of margin and the horizon's price applies
        tight = Scheduler("dragon", margin=gap + 1e-6, horizon=10_000, model=model)
        assert tight.decide("device", 0, near).aggregator == "device"
    with pytest.raises(ValueError, match="horizon"):
        Scheduler("dragon", horizon=-1)
    live = Scheduler.for_config(DragonConfig(switch_horizon=7, switch_margin_s=0.01, seed=3))
    assert (live.horizon, live.margin, live.seed, live.strategy) == (7, 0.01, 3, "dragon")
    assert Scheduler.for_config(DragonConfig()).horizon == 64  # the live default


@given(seconds, seconds, rates, st.floats(min_value=0.0, max_value=2.0))
def test_pipelined_latency_is_eq7_where_a_side_is_the_bottleneck_else_below(c_l, c_r, a_r, rtt):
    """Z' = max(c_l, c_r + (1 - a_r) rtt) never exceeds Eq. 7's expectation (the max of
    expectations is at most the expectation of the max), and equals it where one stream
    bounds the other whatever the outcome: c_r >= c_l (the drafting side is the slower) or
    c_r + rtt <= c_l (even a rejected draft arrives in time)."""
    pipelined = pipelined_latency(c_l, c_r, a_r, rtt)
    eq7 = expected_latency(c_l, c_r, a_r, rtt)
    assert pipelined <= eq7 + 1e-12
    if c_r >= c_l or c_r + rtt <= c_l:
        assert pipelined == pytest.approx(eq7, abs=1e-12)


def test_pipelined_model_keeps_a_slower_bottleneck_aggregating():
    """Cloud 10x faster than the device and its drafts rejected 30% of the time, the
    device's 3%: Eq. 7 charges each cloud rejection the round trip on the token
    clock and hands the aggregator to the cloud; with both sides drafting ahead the cloud
    catches up within the device's decode time (0.008 + 0.3 x 0.2 < 0.08), so the device (the
    bottleneck) keeps it: Z'_device = c_device, Z'_cloud = c_device + 0.03 rtt."""
    est = estimates(0.08, 0.008, 0.97, 0.7, 0.2)
    assert Scheduler("dragon", model="eq7").decide("device", 0, est).aggregator == "cloud"
    kept = Scheduler("dragon").decide("device", 0, est)  # the default model: pipelined
    assert kept.aggregator == "device"
    assert kept.gap == pytest.approx(pipelined_gap(0.08, 0.008, 0.97, 0.7, 0.2))
    assert kept.gap == pytest.approx(0.08 - (0.08 + 0.03 * 0.2))
    # where the device's drafts fail more instead, both models hand it to the device (its own
    # rejections then cost no trip)
    moved = estimates(0.08, 0.008, 0.7, 0.97, 0.2)
    for model in ("eq7", "pipelined"):
        assert Scheduler("dragon", model=model).decide("cloud", 0, moved).aggregator == "device"
    assert Scheduler.for_config(DragonConfig()).model == "pipelined"  # the live default
    assert Scheduler.for_config(DragonConfig(scheduler_model="eq7")).model == "eq7"
    with pytest.raises(ValueError, match="scheduler model"):
        Scheduler("dragon", model="fastest")


def test_mirrored_dragon_keeps_the_aggregator_and_reports_eq8():
    """Under mirroring no placement is faster, so "dragon" never moves the aggregator (a move
    would only cost a message); Eq. 8's gap is still computed, for the record."""
    est = estimates(0.3, 0.2, 1.0, 0.0, 0.5)  # the paper's rule hands over to the cloud here
    paper = Scheduler("dragon").decide("device", 0, est)
    assert paper.aggregator == "cloud"
    for here in ("device", "cloud"):
        kept = Scheduler("dragon", mirrored=True).decide(here, 0, est)
        assert kept.aggregator == here
    assert Scheduler("dragon", mirrored=True).decide("device", 0, est).gap == paper.gap
    # the controls are what they are: a static side, a coin per position
    assert Scheduler("cloud", mirrored=True).decide("device", 0, est).aggregator == "cloud"
    coins = {
        Scheduler("random", mirrored=True).decide("device", t, est).aggregator for t in range(20)
    }
    assert coins == {"device", "cloud"}
    assert Scheduler.for_config(DragonConfig()).mirrored  # the live default mirrors
    assert not Scheduler.for_config(DragonConfig(mirror=False)).mirrored


def test_static_and_random_strategies():
    est = estimates(0.3, 0.2, 1.0, 0.0, 0.5)
    assert {Scheduler("device").decide(s, 0, est).aggregator for s in ("device", "cloud")} == {
        "device"
    }
    assert {Scheduler("cloud").decide(s, 0, est).aggregator for s in ("device", "cloud")} == {
        "cloud"
    }
    picks = [Scheduler("random", seed=1).decide("device", t, est).aggregator for t in range(200)]
    again = [Scheduler("random", seed=1).decide("cloud", t, None).aggregator for t in range(200)]
    assert picks == again  # a function of (seed, position) only
    assert 60 < picks.count("cloud") < 140
    with pytest.raises(ValueError):
        Scheduler("fastest")


def test_the_cloud_picks_the_first_aggregator_from_profiles_prior_and_rtt():
    """`Scheduler.first`: the cloud's pick at READY, from both offline profiles, the acceptance
    prior (0.5 each) and the RTT so far; nothing to repay, so no horizon price."""
    prior = {"device": 0.5, "cloud": 0.5}

    def at(c_device: float, c_cloud: float, rtt: float = 0.3) -> Estimates:
        return Estimates(c_dec={"device": c_device, "cloud": c_cloud}, alpha=prior, rtt=rtt)

    dragon = Scheduler("dragon", horizon=64)
    # device 2x faster: Z'_device = max(.04, .08 + .15) = .23, Z'_cloud = max(.08, .04 + .15) = .19
    assert dragon.first(at(0.04, 0.08)) == "cloud"
    # cloud 2x faster: the slower side aggregates, the faster one pays the round trips
    assert dragon.first(at(0.08, 0.04)) == "device"
    # alike, no RTT sample yet, or no estimates: the paper's start
    assert dragon.first(at(0.06, 0.06)) == "device"
    assert dragon.first(at(0.04, 0.08, rtt=0.0)) == "device"
    assert dragon.first(None) == "device"
    assert Scheduler("dragon", margin=0.05).first(at(0.04, 0.08)) == "device"  # gap .04
    # Eq. 7: Z_device = .5 x .08 + .5 x .38 = .23, Z_cloud = .5 x .08 + .5 x .34 = .21
    assert Scheduler("dragon", model="eq7").first(at(0.04, 0.08)) == "cloud"
    assert Scheduler("dragon", model="eq7", margin=0.03).first(at(0.04, 0.08)) == "device"
    # mirrored: no placement is faster; the static and random strategies start where they did
    assert Scheduler("dragon", mirrored=True).first(at(0.04, 0.08)) == "device"
    assert Scheduler("cloud").first(at(0.08, 0.04)) == "cloud"
    assert Scheduler("device").first(at(0.04, 0.08)) == "device"
    assert Scheduler("random").first(at(0.04, 0.08)) == "device"
