"""The epoch model (tandem.protocols.spec.epochs): its schedule reduces to closed forms where
the pipeline does (one block in flight = PicoSpec's step without overlap; no agreement = cloud
AR; full agreement = the slower side's pace), and its rules (chunks, merged passes, eager's AR
steps and preemption, branches) show where they should."""

from __future__ import annotations

import pytest

from tandem.protocols.spec.epochs import (
    branch_rate,
    commit_times,
    lookahead,
    rate,
    schedule,
)
from tandem.protocols.spec.planner import Branching, Costs, expected_length

# PicoSpec's Tables 1-2: draft 24 ms, a pass over n new tokens 67 + 5 n ms
PAPER = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=0.1)


def _pass(n: int, costs: Costs = PAPER) -> float:
    return costs.t_ar + costs.decode_per_token * n


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.9])
@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_one_block_in_flight_is_eq_5_over_a_whole_round(alpha, gamma):
    """Lookahead = one block, no short first chunk, no truncation: each block waits for the
    last one's verdict, so R = EL / (gamma t_draft + rtt + pass(gamma)) exactly."""
    costs = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=0.1,
                  first_chunk=gamma)  # fmt: skip
    round_s = gamma * costs.t_draft + costs.rtt + _pass(gamma, costs)
    times = commit_times("async", gamma, costs, 3 * gamma, truncate_factor=0,
                         lookahead_drafts=gamma)  # fmt: skip
    assert times == pytest.approx([round_s * (1 + p // gamma) for p in range(3 * gamma)])
    predicted = rate("async", alpha, gamma, costs, truncate_factor=0, lookahead_drafts=gamma)
    assert predicted == pytest.approx(expected_length(alpha, gamma) / round_s, rel=1e-4)


def test_async_first_chunk_is_verified_alone_then_blocks_stream():
    times = commit_times("async", 4, PAPER, 8)
    first = PAPER.rtt + PAPER.t_draft + _pass(1)  # the 1-draft chunk, verified on arrival
    assert times[0] == pytest.approx(first)
    # drafts 2..4 left at h + 4 t_draft, while the cloud was busy: one pass over the three
    assert times[1] == times[2] == times[3] == pytest.approx(first + _pass(3))


def test_full_agreement_runs_at_the_slower_sides_pace():
    assert rate("async", 1.0, 4, PAPER) == pytest.approx(1 / PAPER.t_draft, rel=0.02)
    slow_cloud = Costs(t_draft=0.01, decode_base=0.0, decode_per_token=0.05, rtt=0.0)
    # drafts pile up while a pass runs and join the next one: about the cloud's per-draft cost
    # (each pass also pays one AR step's worth, 0.05 s, over up to `lookahead` drafts)
    merged = rate("async", 1.0, 4, slow_cloud)
    assert 0.9 / 0.05 < merged < 1 / 0.05
    assert merged > rate("async", 1.0, 4, slow_cloud, lookahead_drafts=4)


def test_no_agreement_leaves_eager_at_cloud_ar_and_async_paying_a_round_per_token():
    assert rate("eager", 0.0, 4, PAPER) == pytest.approx(1 / PAPER.t_ar)
    one_round = PAPER.rtt + PAPER.t_draft + _pass(1)
    assert rate("async", 0.0, 4, PAPER) == pytest.approx(1 / one_round)


def test_eager_decodes_alone_until_a_chunk_reaches_past_it_then_preempts():
    times = commit_times("eager", 4, PAPER, 12)
    t_ar = PAPER.t_ar
    assert times[:2] == pytest.approx([t_ar, 2 * t_ar])  # the first chunk came too late
    # drafts 2..4 arrive at rtt + 4 t_draft = 196 ms, 52 ms into the third AR step (< 67 ms:
    # it is preempted); positions 3-4 verified in one pass, position 5 free after it
    arrive = PAPER.rtt + 4 * PAPER.t_draft
    assert times[2] == times[3] == times[4] == pytest.approx(arrive + _pass(2))


def test_eager_waits_for_the_step_when_preempting_would_not_pay():
    cpu = Costs(t_draft=0.047, decode_base=0.0, decode_per_token=0.088, rtt=0.0)
    times = commit_times("eager", 4, cpu, 12)
    t_ar = cpu.t_ar  # 88 ms, all of it per-token work: the fixed part is 0
    # chunk [1] arrives at 47 ms, nothing past the step in flight; drafts 2..4 arrive at
    # 188 ms, 12 ms into the third step, which finishes (264 ms); then one pass over the
    # fourth draft (440 ms); position 5 is free and goes first, though drafts 5..8 wait (free
    # step first); then one pass over the pending token and drafts 6..8, position 9 free
    steps = [1, 2, 3, 5, 5, 9, 9, 9, 9]
    assert times[:9] == pytest.approx([k * t_ar for k in steps])


def test_eager_finishes_the_step_when_the_draft_there_may_differ():
    """The chunk of drafts 2..4 arrives 52 ms into the third AR step: below its fixed part
    (67 ms), so it is preempted when every draft matches, but at alpha 0.75 the threshold is
    0.75 * 67 - 0.25 * 5 * 2 = 47.75 ms: the step finishes, then the fourth draft is verified."""
    t_ar = PAPER.t_ar
    times = commit_times("eager", 4, PAPER, 8, alpha=0.75)
    assert times[:3] == pytest.approx([t_ar, 2 * t_ar, 3 * t_ar])
    assert times[3] == times[4] == pytest.approx(3 * t_ar + _pass(1))  # position 5 free
    assert commit_times("eager", 4, PAPER, 8, alpha=1.0)[2] > 3 * t_ar  # preempted


def test_rate_grows_with_agreement_and_the_lookahead_follows_the_rtt():
    for pipeline in ("async", "eager"):
        rates = [rate(pipeline, a, 4, PAPER) for a in (0.5, 0.7, 0.8, 0.9, 0.95)]
        assert rates == sorted(rates)
    near = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=0.0)
    far = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=1.0)
    assert lookahead(4, near) == 8 and lookahead(4, far) == 32  # between 2 and 8 blocks


def test_unknown_pipeline_is_refused():
    with pytest.raises(ValueError, match="no epoch model"):
        commit_times("sync", 4, PAPER, 4)


def test_a_branch_is_sent_after_its_drafts_and_one_is_open_at_a_time():
    """The device drafts position 1 at h + t_draft, sends it, drafts the branch (4 steps) and
    sends it: it reaches the cloud h later. While the device does not know position 1
    committed (a slow cloud), the unsure drafts after it open no branch."""
    h = PAPER.rtt / 2
    epoch = schedule("eager", 4, PAPER, 12, unsure=[True], branch_len=4)
    assert epoch.branch_arrival == {1: pytest.approx(h + 5 * PAPER.t_draft + h)}
    slow = Costs(t_draft=0.024, decode_base=1.0, decode_per_token=0.005, rtt=0.1)
    epoch = schedule("eager", 4, slow, 12, unsure=[True] * 12, branch_len=4)
    assert list(epoch.branch_arrival) == [1]
    # the branch's four steps delay the chain: draft 2 is done 4 steps later than without
    plain = schedule("eager", 4, slow, 12)
    assert epoch.commit[-1] > plain.commit[-1]


@pytest.mark.parametrize(("warm", "start"), [(-0.01, 0.0), (0.03, 0.03)])
def test_a_taken_branch_is_verified_when_it_is_at_the_cloud(warm, start):
    """A warm epoch: the branch's 4 drafts are verified in one pass as soon as they are at the
    cloud (waiting already, or arriving 30 ms into the first AR step, which they preempt);
    the device hears of the epoch h later and sends its next draft at once (first chunk)."""
    epoch = schedule("eager", 4, PAPER, 12, branch_len=4, warm=warm)
    assert epoch.commit[:4] == pytest.approx([start + _pass(4)] * 4)
    assert epoch.commit[4] == pytest.approx(start + _pass(4))  # the free step after it


def test_branch_rate_without_branches_is_the_epoch_models_rate():
    for rtt in (0.1, 0.2):
        costs = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=rtt)
        for alpha in (0.7, 0.9):
            sampled = branch_rate(alpha, 4, costs, Branching(0.0, 0.0, 0.0))
            assert sampled == pytest.approx(rate("eager", alpha, 4, costs), rel=0.03)
    # seeded: the same figure every call
    again = [branch_rate(0.8, 4, PAPER, Branching(0.3, 0.6, 0.5), epochs=300) for _ in range(2)]
    assert again[0] == again[1]


def test_branches_pay_where_they_hold_the_targets_token_and_cost_where_they_do_not():
    far = Costs(t_draft=0.024, decode_base=0.067, decode_per_token=0.005, rtt=0.2)
    plain = rate("eager", 0.8, 4, far)
    helpful = branch_rate(0.8, 4, far, Branching(0.0, 1.0, 1.0))  # every miss, always right
    useless = branch_rate(0.8, 4, far, Branching(0.9, 1.0, 0.0))  # everywhere, never right
    assert helpful > 1.05 * plain
    assert useless < 0.9 * plain


def test_branches_need_the_eager_pipeline():
    with pytest.raises(ValueError, match="branches need pipeline eager"):
        schedule("async", 4, PAPER, 4, branch_len=4)
