"""Profiler: latency fit and online slope, acceptance moving average, in-band link estimates."""

from __future__ import annotations

import asyncio
import time

import pytest

from tandem.protocols.dragon.profiler import (
    AcceptanceTracker,
    LatencyModel,
    LinkEstimator,
    Timeline,
    cached_profile,
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
    # Laplace's first step (weight 1/3) is smaller than 0.5: the moving average's applies
    tracker.observe({"device": 1.0, "cloud": 0.0}, {"device": True, "cloud": False})
    assert tracker.alpha() == {"device": 0.75, "cloud": 0.25}
    tracker.observe({"device": 0.0, "cloud": 1.0}, {"device": False, "cloud": True})
    assert tracker.alpha() == {"device": 0.375, "cloud": 0.625}
    assert tracker.observed_rate("device") == 0.5


def test_acceptance_starts_as_laplaces_rule_then_moves_to_the_average():
    """(1 + accepted) / (2 + seen) while 1 / (seen + 2) > weight, so one greedy 0/1 outcome
    cannot set a rate to 0 or 1; then each observation weighs `weight`."""
    tracker = AcceptanceTracker(weight=0.05)
    outcomes = [False, True, True, False, True] + [True] * 13  # 18: 1 / 20 == weight
    for n, ok in enumerate(outcomes, start=1):
        tracker.observe({"device": float(ok), "cloud": 1.0}, {"device": ok, "cloud": True})
        laplace = (1 + sum(outcomes[:n])) / (2 + n)
        assert tracker.alpha()["device"] == pytest.approx(laplace)
        assert tracker.alpha()["cloud"] == pytest.approx((1 + n) / (2 + n))
    before = tracker.alpha()["device"]
    tracker.observe({"device": 0.0, "cloud": 1.0}, {"device": False, "cloud": True})
    assert tracker.alpha()["device"] == pytest.approx(0.95 * before)  # weight 0.05 from here
    # recorded Eq. 5 rates (sampling) go through the same steps
    rated = AcceptanceTracker(weight=0.05)
    rated.observe({"device": 0.8, "cloud": 0.2}, {"device": True, "cloud": False})
    assert rated.alpha() == pytest.approx({"device": 0.6, "cloud": 0.4})


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


def test_timeline_splits_every_gap_into_own_peer_and_resolve():
    from tandem.protocols.dragon.profiler import Timeline

    timeline = Timeline()
    timeline.started = 10.0
    # position 0: own draft at +1.0, peer's at +1.5, resolved at +1.6 (TTFT 1.6 s)
    # position 1: own draft already queued (+1.2, before position 0 resolved), peer +1.9, +2.0
    # position 2: peer first (+2.1), own +2.3, resolved +2.3
    timeline.own = {0: 11.0, 1: 11.2, 2: 12.3}
    timeline.peer = {0: 11.5, 1: 11.9, 2: 12.1}
    timeline.commit = {0: 11.6, 1: 12.0, 2: 12.3}
    timeline.add("decode", 0.9)
    rows = timeline.critical()
    assert [round(r["gap_ms"]) for r in rows] == [1600, 400, 300]
    assert [round(r["own_ms"]) for r in rows] == [1000, 0, 300]
    assert [round(r["peer_ms"]) for r in rows] == [500, 300, 0]
    assert [round(r["resolve_ms"]) for r in rows] == [100, 100, 0]
    summary = timeline.summary()
    assert summary["tokens"] == 3 and summary["ttft_ms"]["gap_ms"] == pytest.approx(1600)
    assert summary["mean_gap_ms"] == pytest.approx(350)
    assert summary["critical_ms_per_token"]["peer"] == pytest.approx(150)
    assert summary["work_ms_per_token"]["decode"] == pytest.approx(300)
    assert summary["work_share"]["decode"] == pytest.approx(300 / 350)


def test_process_cpu_counts_the_work_between_the_first_and_the_last_resolution():
    timeline = Timeline()
    timeline.mark("commit", 0)
    assert timeline.summary()["cpu_ms_per_token"]["process"] is None  # one token: no gap
    began = time.process_time()
    while time.process_time() - began < 0.02:  # 20 ms of this thread's CPU
        pass
    timeline.mark("commit", 1)
    timeline.mark("commit", 2)
    process = timeline.summary()["cpu_ms_per_token"]["process"]
    assert 20 / 2 <= process < 20  # 20+ ms over two later tokens


def _burn(seconds: float) -> None:
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass


def test_decode_cpu_in_the_window_counts_the_decode_in_flight_and_not_the_drafts_before_it():
    timeline = Timeline()
    timeline.add("decode", 0.05, cpu=True)  # a draft decoded before the first resolution
    timeline.mark("commit", 0)
    cpu = timeline.cpu_began("decode")
    _burn(0.02)  # 20 ms of decode CPU, still in flight at the next resolution
    timeline.mark("commit", 1)
    timeline.add("decode", time.thread_time() - cpu, cpu=True)
    _burn(0.01)  # 10 ms of other work, no decode
    timeline.mark("commit", 2)
    cpu_ms = timeline.summary()["cpu_ms_per_token"]
    assert 20 / 2 <= cpu_ms["decode_in_window"] < 25 / 2  # not the 50 ms before the window
    assert 30 / 2 <= cpu_ms["process"]
    assert 10 / 2 <= cpu_ms["process"] - cpu_ms["decode_in_window"] < 20 / 2
    assert cpu_ms["decode"] > 50 / 3  # the totals keep every decode


def test_live_session_reports_both_timelines(tiny_lm, tiny_lm_b, corpora):
    from tandem.protocols.dragon import run_pair

    from .conftest import QUESTION, tiny_config

    device, cloud = asyncio.run(
        run_pair(
            device_lm=tiny_lm, cloud_lm=tiny_lm_b, device_knowledge=corpora[0],
            cloud_knowledge=corpora[1], question=QUESTION,
            config=tiny_config(max_new_tokens=6, timeline=True),
        )
    )  # fmt: skip
    for side in (device.timeline, device.peer_timeline, cloud.timeline):
        assert side["tokens"] == 6
        assert side["work_ms_per_token"]["decode"] > 0 and side["work_ms_per_token"]["codec"] > 0
        assert side["cpu_ms_per_token"]["decode"] > 0 and side["startup_cpu_ms"]["prefill"] > 0
        assert side["cpu_ms_per_token"]["process"] > 0
        assert (
            0 < side["cpu_ms_per_token"]["decode_in_window"] <= side["cpu_ms_per_token"]["process"]
        )
        for row in side["per_token"]:
            parts = row["own_ms"] + row["peer_ms"] + row["resolve_ms"]
            assert parts == pytest.approx(row["gap_ms"])
            assert min(row["own_ms"], row["peer_ms"], row["resolve_ms"]) >= -1e-6
    assert device.peer_timeline["per_token"] == cloud.timeline["per_token"]
    assert device.summary()["peer_timeline"] == device.peer_timeline  # saved with the results


def test_profile_cache_survives_two_writers_at_once(tmp_path, monkeypatch):
    """The device and the cloud of one testbed profile the same model at once: both write
    before either moves its file into place (a shared temporary name failed here in CI)."""
    import os
    import threading
    import types

    from tandem.protocols.dragon import profiler

    monkeypatch.setattr(profiler, "profile_decode", lambda lm, **kw: LatencyModel(intercept=0.01))
    both_written = threading.Barrier(2, timeout=10)
    real_replace = os.replace

    def replace_after_both_wrote(src, dst):
        both_written.wait()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_after_both_wrote)
    lm = types.SimpleNamespace(fingerprint="f" * 40)
    errors = []

    def profile():
        try:
            cached_profile(lm, batch=2, cache_dir=tmp_path)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=profile) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["ffffffffffffffffffffffff-batch2.json"]
    monkeypatch.undo()
    assert cached_profile(lm, batch=2, cache_dir=tmp_path).intercept == 0.01
