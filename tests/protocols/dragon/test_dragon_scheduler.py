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
    # the cloud decodes 2x faster, its drafts pass a little less often: a small gap for it
    near = estimates(0.11, 0.055, 0.90, 0.85, 0.4)
    gap = Scheduler("dragon").decide("device", 0, near).gap
    assert 0 < gap < 0.05
    price_horizon = 0.2 / gap  # rtt / 2 / H == gap
    stay, move = int(price_horizon) - 1, int(price_horizon) + 1
    assert stay >= 1
    assert Scheduler("dragon", horizon=0).decide("device", 0, near).aggregator == "cloud"
    assert Scheduler("dragon", horizon=move).decide("device", 0, near).aggregator == "cloud"
    assert Scheduler("dragon", horizon=stay).decide("device", 0, near).aggregator == "device"
    # the larger of margin and the horizon's price applies
    assert (
        Scheduler("dragon", margin=gap + 1e-6, horizon=10_000).decide("device", 0, near).aggregator
        == "device"
    )
    with pytest.raises(ValueError, match="horizon"):
        Scheduler("dragon", horizon=-1)
    live = Scheduler.for_config(DragonConfig(switch_horizon=7, switch_margin_s=0.01, seed=3))
    assert (live.horizon, live.margin, live.seed, live.strategy) == (7, 0.01, 3, "dragon")
    assert Scheduler.for_config(DragonConfig()).horizon == 64  # the live default


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
