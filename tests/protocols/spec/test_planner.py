"""The cost model and the adaptive controller (tandem.protocols.spec.planner): the formulas
reduce to PicoSpec's Eq. 7 / 9 (theory.py) and to their limits, and the controller picks
cloud AR on this CPU's measured regime and speculation on the paper's."""

from __future__ import annotations

import pytest

from tandem.protocols.spec import theory
from tandem.protocols.spec.planner import MARGIN, Controller, Costs, best, throughput

PAPER = Costs.from_points(t_draft=0.024, t_ar=0.072, t_block=0.087, block=4, rtt=0.1)
# this machine, each side on its own core, as the eager probe measured it
# (benchmarks/results/humaneval_eager_probe.json, RTT 0, load 2.4-4.7): 1.5B AR 127-170 ms per
# token, eager verify passes 840-1200 ms, 0.5B draft step 71-212 ms; representative values:
# AR 145 ms, a pass over 3 drafts 680 ms, a draft step 170 ms (slower than the cloud's AR)
CPU = Costs.from_points(t_draft=0.17, t_ar=0.145, t_block=0.68, block=3, rtt=0.0)
# the same machine as benchmarks/results/humaneval.json measured it under other load: AR 173 ms,
# a stop-and-wait pass over 5 tokens 590 ms, a draft step 100 ms
CPU_HUMANEVAL = Costs.from_points(t_draft=0.10, t_ar=0.173, t_block=0.59, block=5, rtt=0.0)


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


def test_eager_catches_up_only_with_a_device_faster_than_the_clouds_own_decoding():
    from tandem.protocols.spec.planner import catch_up_drafts

    assert catch_up_drafts(4, PAPER) == 4  # (0.1 + 0.072) / (0.072 - 0.024) = 3.6 drafts
    far = Costs(**{**PAPER.__dict__, "rtt": 0.2})
    assert catch_up_drafts(4, far) == 8  # 5.7 drafts: the second block
    slow = Costs(**{**PAPER.__dict__, "t_draft": 0.08})
    assert throughput("eager", 0.99, 4, slow) == pytest.approx(1 / PAPER.t_ar)


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
    assert cpu.predicted_tok_s == pytest.approx(1 / 0.145)
    # a device slower than the cloud's own decoding never gets ahead: eager is cloud AR
    assert max(cpu.table["eager"].values()) == pytest.approx(1 / 0.145)
    # with a faster device and a cheaper block, speculating pays a little (7 vs 5.8 tok/s)
    other = best(0.9, CPU_HUMANEVAL)
    assert other.method == "eager" and other.predicted_tok_s > 1.1 / 0.173
    paper = best(0.9, PAPER)
    assert paper.method == "eager" and paper.gamma >= 2
    top = max(max(v.values()) for v in paper.table.values())
    assert paper.predicted_tok_s >= top / (1 + MARGIN)
    assert set(paper.table) == {"ar", "sync", "async", "eager"}


def test_controller_moves_from_its_prior_to_what_it_measures():
    controller = Controller(prior=PAPER, alpha=0.9)
    assert controller.plan().method == "eager"
    for _ in range(40):  # the pair turns out to be this CPU's
        controller.observe_ar(0.145)
        controller.observe_verify(3, 0.68)
        controller.observe_draft(0.17)
        controller.observe_network(0.0)
        controller.observe_drafts(9, 1)
    assert controller.alpha_estimate == pytest.approx(0.9, abs=0.02)
    costs = controller.costs()
    assert costs.t_ar == pytest.approx(0.145) and costs.t_decode(3) == pytest.approx(0.68)
    assert controller.plan().method == "ar"
    # drafts that never match: speculation cannot pay, even on the paper's hardware
    cold = Controller(prior=PAPER, alpha=0.9)
    for _ in range(100):
        cold.observe_drafts(0, 1)
    assert cold.alpha_estimate < 0.2
    assert cold.plan(("ar", "eager")).method == "ar"  # eager only ties it: the simpler wins


def test_exploring_leaves_cloud_ar_out_and_unmeasured_speculates():
    from tandem.protocols.spec.planner import UNMEASURED

    assert Controller(prior=UNMEASURED).plan(("ar", "eager")).method == "eager"
    controller = Controller(prior=CPU, alpha=0.9)
    assert controller.plan(("ar", "eager")).method == "ar"
    controller.exploring = True
    plan = controller.plan(("ar", "eager"))
    assert plan.method == "eager" and plan.gamma >= 1 and "ar" not in plan.table
    assert controller.plan(("ar",)).method == "ar"  # nothing else to explore: as asked
    controller.exploring = False
    assert controller.plan(("ar", "eager")).method == "ar"
    # a guessed prior: a fast target step measured before any draft step does not stop the
    # drafting that would measure the draft step (measure_first); the first draft step does
    fresh = Controller(prior=UNMEASURED, measure_first=True)
    fresh.observe_ar(0.001)
    assert fresh.plan(("ar", "eager")).method == "eager"
    assert Controller(prior=UNMEASURED).plan(("ar", "eager")).method == "eager"
    fresh.observe_draft(0.03)
    assert fresh.plan(("ar", "eager")).method == "ar"


def test_generations_plan_ar_eager_and_explore_every_nth_ar():
    """planner.Generations: a generation runs as the controller plans it; every
    `explore_every`-th one in a row planned as AR explores (eager with `exploring` set for it
    alone); an AR stream's time per token feeds t_ar; 0 never explores."""
    from tandem.protocols.spec.planner import UNMEASURED, Generations

    fresh = Generations(Controller(prior=UNMEASURED, measure_first=True), explore_every=3)
    assert [fresh.plan(), fresh.plan()] == ["eager", "eager"]  # nothing measured: speculate
    controller = Controller(prior=CPU, alpha=0.9)  # drafting cannot pay here
    generations = Generations(controller, explore_every=3)
    assert [generations.plan() for _ in range(7)] == ["ar", "ar", "explore"] * 2 + ["ar"]
    with generations.running("explore") as running:
        assert running is controller and controller.exploring
        assert controller.plan(("ar", "eager")).method == "eager"
    assert not controller.exploring
    with pytest.raises(RuntimeError), generations.running("explore"):
        raise RuntimeError("the generation failed")
    assert not controller.exploring  # reset on failure too
    with generations.running("eager"):
        assert not controller.exploring
    assert generations.plan() == "ar" and generations.streak == 2
    assert generations.not_served() == "eager" and generations.streak == 0
    generations.measured_ar(None)  # a one-token answer measured no step
    assert controller.costs().t_ar == pytest.approx(CPU.t_ar)
    generations.measured_ar(60.0)  # ms; the first measurement replaces the prior's
    assert controller.costs().t_ar == pytest.approx(0.060)
    never = Generations(Controller(prior=CPU, alpha=0.9))
    assert {never.plan() for _ in range(40)} == {"ar"}
    controller.observe_draft(0.001)  # drafting pays now: eager, and the streak restarts
    controller.observe_verify(4, 0.07)
    for _ in range(10):
        controller.observe_drafts(10, 0)
    assert generations.plan() == "eager" and generations.streak == 0
