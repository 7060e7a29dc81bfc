"""Profiler: latency fit and online slope, acceptance moving average, in-band link estimates."""

from __future__ import annotations

import asyncio

import pytest

from tandem.protocols.dragon.profiler import (
    AcceptanceTracker,
    LatencyModel,
    LinkEstimator,
    fit_latency,
)
from tandem.protocols.dragon.wire import pad_message
from tandem.transport import LinkConfig, memory_pair


def test_least_squares_fit_recovers_the_line():
    contexts = [64, 96, 128, 192, 256]
    model = fit_latency(contexts, [0.05 + 2e-4 * t for t in contexts])
    assert model.intercept == pytest.approx(0.05)
    assert model.slope == pytest.approx(2e-4)
    assert model.predict(300) == pytest.approx(0.05 + 0.06)


def test_online_update_follows_a_new_slope_with_the_intercept_frozen():
    model = fit_latency([64, 128, 256], [0.05 + 1e-4 * t for t in (64, 128, 256)])
    for step in range(200):
        t = 100 + step
        model.update(t, 0.05 + 5e-4 * t, rho=0.1)
    assert model.intercept == pytest.approx(0.05)
    assert model.slope == pytest.approx(5e-4, rel=1e-3)


def test_model_without_offline_fit_starts_from_the_first_sample():
    model = LatencyModel()
    assert model.predict(100) == 0.0
    model.update(100, 0.2, rho=0.1)
    assert model.predict(100) == pytest.approx(0.2)
    assert LatencyModel.from_list(model.to_list()).predict(50) == pytest.approx(0.1)


def test_acceptance_moving_average():
    tracker = AcceptanceTracker(weight=0.5)
    assert tracker.alpha() == {"device": 0.5, "cloud": 0.5}
    tracker.observe({"device": 1.0, "cloud": 0.0}, {"device": True, "cloud": False})
    assert tracker.alpha() == {"device": 1.0, "cloud": 0.0}
    tracker.observe({"device": 0.0, "cloud": 1.0}, {"device": False, "cloud": True})
    assert tracker.alpha() == {"device": 0.5, "cloud": 0.5}
    assert tracker.observed_rate("device") == 0.5


def test_link_estimator_measures_rtt_and_uplink_rate_in_band():
    async def main():
        link = LinkConfig(delay_ms=15.0, rate_mbit=4.0)
        device, cloud = memory_pair(link=link)
        drain = asyncio.create_task(_drain(cloud))
        estimator = LinkEstimator(device)
        await estimator.probe_bandwidth(pad_message(0, 50_000), 50_000)
        rtt = await device.ping(5.0)
        drain.cancel()
        await device.close()
        await cloud.close()
        return estimator, rtt

    estimator, rtt = asyncio.run(main())
    assert 0.025 < rtt < 0.2 and 0.025 < estimator.rtt < 0.2
    assert estimator.bandwidth_bps == pytest.approx(4e6 / 8, rel=0.5)
    assert estimator.round_trip(1000, 0) == pytest.approx(
        estimator.rtt + 1000 / estimator.bandwidth_bps
    )


async def _drain(channel) -> None:
    async for _ in channel:
        pass
