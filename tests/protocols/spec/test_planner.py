"""The cost model and the adaptive controller (tandem.protocols.spec.planner): the formulas
reduce to PicoSpec's Eq. 7 / 9 (theory.py) and to their limits, and the controller picks
cloud AR on this CPU's measured regime and speculation on the paper's."""

from __future__ import annotations

import math

import pytest

from tandem.protocols.spec import theory
from tandem.protocols.spec.planner import Controller, Costs, best, throughput

PAPER = Costs.from_points(t_draft=0.024, t_ar=0.072, t_block=0.087, block=4, rtt=0.1)
# bench/results/humaneval.json (RTT 0): 1.5B AR 160-200 ms/token, a verify pass over 5 tokens
# (4 drafts + the pending one) ~590 ms, 0.5B draft step ~100 ms
CPU = Costs.from_points(t_draft=0.10, t_ar=0.16, t_block=0.59, block=5, rtt=0.0)


def test_costs_from_points_is_the_line_through_them():
    assert PAPER.t_ar == pytest.approx(0.072)
    assert PAPER.t_decode(4) == pytest.approx(0.087)
    assert PAPER.decode_per_token == pytest.approx(0.005)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.9])
def test_sync_and_async_are_picospec_eq_7_and_9(alpha):
    gamma = 4
    t_draft, t_v = gamma * PAPER.t_draft, PAPER.t_decode(gamma)
    assert throughput("async", alpha, gamma, PAPER) == pytest.approx(
        theory.async_throughput(alpha, gamma, t_draft, PAPER.rtt, t_v)
    )
    assert throughput("sync", alpha, gamma, PAPER) == pytest.approx(
        theory.sync_throughput(alpha, gamma, t_draft, PAPER.rtt, PAPER.t_decode(gamma + 1))
    )
    assert throughput("ar", alpha, gamma, PAPER) == pytest.approx(1 / 0.072)


def test_eager_limits():
    gamma = 4
    # alpha = 0: every draft is rejected; the cloud's own decoding is all that is left
    assert throughput("eager", 0.0, gamma, PAPER) == pytest.approx(1 / PAPER.t_ar, rel=1e-6)
    # alpha = 1: blocks stream at the slower side's pace, the RTT hidden
    streaming = gamma / max(gamma * PAPER.t_draft, PAPER.t_decode(gamma))
    assert throughput("eager", 1.0, gamma, PAPER) == pytest.approx(streaming)
    # in between it is never below cloud AR nor below PicoSpec's pipeline in this regime
    for alpha in (0.3, 0.6, 0.8, 0.9, 0.95):
        eager = throughput("eager", alpha, gamma, PAPER)
        assert eager >= throughput("async", alpha, gamma, PAPER)
        assert eager >= 1 / PAPER.t_ar


def test_eager_gains_shrink_with_the_rtt():
    rates = [
        throughput("eager", 0.8, 4, Costs(**{**PAPER.__dict__, "rtt": rtt}))
        for rtt in (0.0, 0.1, 0.2, 0.4)
    ]
    assert rates == sorted(rates, reverse=True)


def test_best_picks_cloud_ar_on_this_cpu_and_speculation_on_the_paper_hardware():
    cpu = best(0.9, CPU)
    assert cpu.method == "ar" and cpu.gamma == 0
    assert cpu.predicted_tok_s == pytest.approx(1 / 0.16)
    paper = best(0.9, PAPER)
    assert paper.method == "eager" and paper.gamma >= 2
    assert paper.predicted_tok_s == max(max(v.values()) for v in paper.table.values())
    assert set(paper.table) == {"ar", "sync", "async", "eager"}


def test_controller_moves_from_its_prior_to_what_it_measures():
    controller = Controller(prior=PAPER, alpha=0.9)
    assert controller.plan().method == "eager"
    for _ in range(40):  # the cloud turns out CPU-like: a block costs ~4 steps
        controller.observe_ar(0.16)
        controller.observe_verify(5, 0.59)
        controller.observe_draft(0.10)
        controller.observe_network(0.0)
        controller.observe_drafts(9, 1)
    assert controller.alpha_estimate == pytest.approx(0.9, abs=0.02)
    costs = controller.costs()
    assert costs.t_ar == pytest.approx(0.16) and costs.t_decode(5) == pytest.approx(0.59)
    assert controller.plan().method == "ar"
    # drafts that never match: speculation cannot pay, even on the paper's hardware
    cold = Controller(prior=PAPER, alpha=0.9)
    for _ in range(100):
        cold.observe_drafts(0, 1)
    assert cold.alpha_estimate < 0.2
    assert cold.plan(("ar", "eager")).method == "ar" or math.isclose(
        cold.plan(("ar", "eager")).predicted_tok_s, 1 / PAPER.t_ar, rel=0.05
    )
