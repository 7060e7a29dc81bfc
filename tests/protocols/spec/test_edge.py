"""PicoSpec's device-side pipeline rules (spec/edge.py), without a model, a network or a
clock: when a chunk is due, when to draft or wait, truncation, lookahead, re-planning."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.edge import EdgeMachine
from tandem.protocols.spec.planner import Controller, Costs


@dataclass
class Counts:
    """The drafter's counters the machine reads (spec.drafter.Drafter has the same names)."""

    frontier: int = 0  # verified output tokens
    sent: int = 0  # drafts in flight
    drafts: list = field(default_factory=list)  # drafts held: sent + unsent
    may_draft: bool = True
    out_of_budget: bool = False

    @property
    def unsent(self) -> int:
        return len(self.drafts) - self.sent

    def can_draft(self) -> bool:
        return self.may_draft

    def exhausted(self) -> bool:
        return self.out_of_budget


def drafter(frontier=0, sent=0, held=0, **kw) -> Counts:
    return Counts(frontier=frontier, sent=sent, drafts=[0] * held, **kw)


def machine(**config) -> EdgeMachine:
    return EdgeMachine(SpecConfig(pipeline="async", **config))


def test_blocks_are_due_at_gamma_boundaries_and_the_first_early_with_fast_verify():
    m = machine(draft_len=4, fast_verify=False)
    assert m.boundary(drafter()) == 4 and m.boundary(drafter(sent=4, held=4)) == 8
    assert not m.chunk_due(drafter(held=3)) and m.chunk_due(drafter(held=4))
    fast = machine(draft_len=4, fast_verify=True, first_chunk=2)
    assert fast.boundary(drafter()) == 2  # the pre-verify chunk
    assert fast.chunk_due(drafter(held=2)) and not fast.chunk_due(drafter(sent=2, held=3))
    assert fast.boundary(drafter(sent=2, held=3)) == 4
    # a new epoch restarts the count from its frontier
    fast.rejected(frontier=10)
    assert fast.boundary(drafter(frontier=10)) == 2 and fast.chunk_due(drafter(frontier=10, held=2))


def test_a_partial_chunk_goes_when_nothing_else_can_happen():
    m = machine(draft_len=4, fast_verify=False)
    assert not m.chunk_due(drafter())  # nothing unsent
    assert m.chunk_due(drafter(held=1, out_of_budget=True))  # token budget reached
    assert m.chunk_due(drafter(held=1, may_draft=False))  # idle: nothing in flight to wait for
    assert not m.chunk_due(drafter(sent=1, held=2, may_draft=False))  # a verdict will come


def test_next_action_sends_drafts_or_waits():
    m = machine(draft_len=4, fast_verify=False)
    assert m.next_action(drafter(held=4)) == "send"
    assert m.next_action(drafter(held=2)) == "draft"
    assert m.next_action(drafter(sent=2, held=3, may_draft=False)) == "wait"
    m.speculate = False  # the plan says: let the cloud's AR stream run alone
    assert m.next_action(drafter(held=2)) == "wait"


def test_truncation_sends_a_slow_partial_block_after_factor_times_its_expected_time():
    m = machine(draft_len=4, fast_verify=False, truncate_factor=2.0)
    d = drafter(held=1)
    assert m.truncation_timeout(d, now=0.0) is None  # no step measured yet
    m.step_timed(0.1)
    assert m.truncation_timeout(d, now=0.0) is None  # the chunk's clock has not started
    m.drafting(now=10.0)
    m.drafting(now=11.0)  # only the chunk's first step starts its clock
    # 4 tokens due, none sent: 2.0 * 4 * 0.1 = 0.8 s after 10.0
    assert m.truncation_timeout(d, now=10.2) == pytest.approx(0.6)
    assert m.truncation_timeout(d, now=20.0) == 0.0
    m.chunk_sent()
    assert m.truncation_timeout(d, now=10.2) is None
    assert machine(truncate_factor=0.0).truncation_timeout(d, now=0.0) is None


def test_lookahead_covers_a_measured_round_trip_between_two_and_eight_blocks():
    m = machine(draft_len=4)
    assert m.lookahead() == SpecConfig(pipeline="async", draft_len=4).lookahead  # unmeasured
    m.step_timed(0.05)
    m.verdict_latency(1.0)  # 1.0 / (0.05 * 4) = 5 blocks in flight, + 1
    assert m.lookahead() == 6 * 4
    m.verdict_latency(100.0)
    assert m.lookahead() == 8 * 4
    fixed = machine(draft_len=4, lookahead_blocks=3)
    fixed.step_timed(0.05), fixed.verdict_latency(1.0)
    assert fixed.lookahead() == 12  # a configured lookahead wins


def test_averages_weigh_the_newest_sample_by_three_tenths():
    m = machine()
    m.step_timed(1.0), m.step_timed(2.0)
    assert m.step_ema == pytest.approx(1.3)
    m.verdict_latency(0.5)
    assert m.latency_ema == 0.5


def test_replan_takes_the_controllers_block_and_its_choice_to_speculate():
    paper = Costs.from_points(t_draft=0.024, t_ar=0.072, t_block=0.087, block=4, rtt=0.1)
    m = EdgeMachine(SpecConfig(pipeline="eager"), controller=Controller(prior=paper, alpha=0.9))
    m.replan()  # not eager: the machine keeps its config
    assert m.gamma == 4 and m.speculate
    m.eager = True
    m.replan()
    plan = m.controller.plan(("ar", "eager"))
    assert m.speculate and m.gamma == plan.gamma
    for _ in range(100):  # drafts that never match
        m.controller.observe_drafts(0, 1)
    m.replan()
    assert not m.speculate
