"""The sans-I/O DRAGON side machine: events in, actions out, no clock (machine.SideMachine)."""

from __future__ import annotations

import pytest
import torch

from tandem.protocols.dragon.machine import (
    Committed,
    Decided,
    Finished,
    MakeBranch,
    SendDraft,
    SendSwitch,
    SendTarget,
    SideMachine,
    prefix_crc,
)
from tandem.protocols.dragon.profiler import LatencyModel
from tandem.protocols.dragon.queues import Draft
from tandem.protocols.dragon.scheduler import Scheduler


class TableRule:
    """Target token per position from a table; rates are the 0/1 outcomes."""

    def __init__(self, targets: dict[int, int]):
        self.targets, self.calls = targets, []

    def aggregate(self, device, cloud):
        self.calls.append((device.position, device.token, cloud.token))
        return self.targets[device.position]

    def rates(self, device, cloud, accepted):
        return {side: float(ok) for side, ok in accepted.items()}


def draft(
    side: str, position: int, token: int, epoch: int = 0, seconds: float = 0.1, branch_of=None
) -> Draft:
    return Draft(
        side=side, position=position, epoch=epoch, token=token, dense=torch.zeros(4),
        logweight=0.0, payload=b"x", decode_s=seconds, context=10 + position, branch_of=branch_of,
    )  # fmt: skip


def machine(
    role="device", *, targets=None, strategy="device", first="device", tokens=8, eos=None,
    branch="off", rtt=0.05, mirror=False,
):  # fmt: skip
    return SideMachine(
        role,
        rule=TableRule(targets or {}),
        scheduler=Scheduler(strategy),
        first_aggregator=first,
        max_new_tokens=tokens,
        latency={"device": LatencyModel(), "cloud": LatencyModel()},
        rtt=lambda: rtt,
        acceptance_ema=0.5,
        slope_weight=0.1,
        eos_id=eos,
        branch=branch,
        mirror=mirror,
    )


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_the_aggregator_resolves_as_soon_as_both_drafts_are_queued():
    m = machine(targets={0: 5, 1: 7})
    first = m.own_draft(draft("device", 0, 5))
    assert kinds(first) == ["SendDraft"] and first[0].draft.token == 5
    actions = m.peer_draft(draft("cloud", 0, 6))
    assert kinds(actions) == ["Committed", "SendTarget", "Decided"]
    committed, target, decided = actions
    outcome = {"device": True, "cloud": False}
    assert committed == Committed(0, 5, "device", True, outcome, 0, {"device": 1.0, "cloud": 0.0})
    assert target == SendTarget(0, 5, {"device": True, "cloud": False})
    assert decided.decision.aggregator == "device" and decided.estimates.rtt == 0.05
    assert m.committed == [5] and m.epochs == {"device": 0, "cloud": 1}
    # the first outcome at the moving average's weight (0.5 here) from the prior 0.5
    assert m.tracker.alpha() == {"device": 0.75, "cloud": 0.25}


def test_a_rejection_bumps_the_epoch_and_stale_drafts_are_dropped():
    m = machine(targets={0: 9, 1: 3})
    m.own_draft(draft("device", 0, 1))
    m.own_draft(draft("device", 1, 2))
    actions = m.peer_draft(draft("cloud", 0, 9))
    assert actions[0].accepted == {"device": False, "cloud": True} and actions[0].epoch == 1
    assert m.own_draft(draft("device", 2, 4, epoch=0)) == []  # made before the rejection
    assert m.drafts_dropped["device"] == 1
    assert m.peer_draft(draft("cloud", 0, 9)) == []  # already resolved
    assert m.drafts_dropped["cloud"] == 1
    with pytest.raises(ValueError, match="epoch 3"):
        m.peer_draft(draft("cloud", 1, 3, epoch=3))
    assert kinds(m.own_draft(draft("device", 1, 3, epoch=1))) == ["SendDraft"]
    assert kinds(m.peer_draft(draft("cloud", 1, 3))) == ["Committed", "SendTarget", "Decided"]


def test_the_non_aggregator_follows_targets_and_refuses_wrong_ones():
    m = machine("cloud", first="device")
    m.own_draft(draft("cloud", 0, 4))
    m.peer_draft(draft("device", 0, 4))
    with pytest.raises(ValueError, match="position 1"):
        m.target(1, 4)
    (committed,) = m.target(0, 4)
    assert committed.accepted == {"device": True, "cloud": True} and committed.by == "device"
    assert committed.aggregated  # both drafts were here: the tracker learnt from it
    owner = machine(first="device")
    with pytest.raises(ValueError, match="while this side aggregates"):
        owner.target(0, 1)


def test_a_switch_naming_this_side_makes_it_aggregate_what_is_queued():
    m = machine("cloud", targets={1: 8}, strategy="cloud", first="device")
    for position, token in ((0, 2), (1, 8)):
        m.own_draft(draft("cloud", position, token))
        m.peer_draft(draft("device", position, token))
    actions = m.switch(0, 2, "cloud")
    assert kinds(actions) == ["Committed", "Committed", "SendTarget", "Decided"]
    assert m.switches == [(0, "cloud")] and m.committed == [2, 8] and m.aggregator == "cloud"


def test_the_scheduler_moves_the_aggregator_but_never_at_the_last_position():
    m = machine(targets={0: 1, 1: 1}, strategy="cloud", tokens=2)
    m.own_draft(draft("device", 0, 1))
    actions = m.peer_draft(draft("cloud", 0, 1))
    assert isinstance(actions[1], SendSwitch) and actions[1].aggregator == "cloud"
    assert m.aggregator == "cloud" and m.switches == [(0, "cloud")]
    # the cloud aggregates position 1; the device learns the last token as a target
    m.own_draft(draft("device", 1, 1))
    assert kinds(m.target(1, 1)) == ["Committed", "Finished"]
    last = machine(targets={0: 1}, strategy="cloud", tokens=1)
    last.own_draft(draft("device", 0, 1))
    actions = last.peer_draft(draft("cloud", 0, 1))
    assert kinds(actions) == ["Committed", "Finished", "SendTarget", "Decided"]
    assert actions[-1] == Decided(0, actions[-1].decision, None)
    assert actions[-1].decision.aggregator == "device"


def test_eos_finishes_and_later_events_are_ignored():
    m = machine(targets={0: 0}, eos=0)
    m.own_draft(draft("device", 0, 0))
    actions = m.peer_draft(draft("cloud", 0, 0))
    assert Finished("eos") in actions and m.finished == "eos"
    assert m.own_draft(draft("device", 1, 3)) == []
    assert m.peer_draft(draft("cloud", 1, 3)) == []
    assert m.target(1, 3) == [] and m.switch(1, 3, "device") == [] and m.link_lost() == []


def test_a_lost_link_degrades_the_device_and_aborts_the_cloud():
    device = machine(targets={})
    device.own_draft(draft("device", 0, 6))
    device.own_draft(draft("device", 1, 7))
    actions = device.link_lost()
    assert [a.token for a in actions if isinstance(a, Committed)] == [6, 7]
    assert not any(a.aggregated or a.rates for a in actions if isinstance(a, Committed))
    assert device.degraded and device.degraded_at == 0 and device.rule.calls == []
    assert kinds(device.own_draft(draft("device", 2, 1))) == ["SendDraft", "Committed"]
    cloud = machine("cloud")
    assert cloud.link_lost() == [Finished("aborted")] and cloud.finished == "aborted"


def test_estimates_come_from_the_drafts_seen_and_the_drivers_rtt():
    m = machine(targets={0: 1})
    m.own_draft(draft("device", 0, 1, seconds=0.3))
    m.peer_draft(draft("cloud", 0, 1, seconds=0.1))
    c_dec = m.estimates().c_dec
    assert c_dec["device"] > c_dec["cloud"] > 0
    assert m.decode_times == {"device": [(10, 0.3)], "cloud": [(10, 0.1)]}


# ---- branch drafts ----------------------------------------------------------------------
# Seconds per decode 0.1 (the drafts' decode_s), so a round trip above 0.2 s makes branching pay.


def test_the_non_aggregator_asks_for_a_branch_where_the_drafts_differ():
    m = machine("cloud", first="device", branch="peer", rtt=0.6)
    assert kinds(m.own_draft(draft("cloud", 0, 4))) == ["SendDraft"]
    assert m.peer_draft(draft("device", 0, 4)) == []  # they agree: nothing to branch on
    m.own_draft(draft("cloud", 1, 5))
    assert m.peer_draft(draft("device", 1, 6)) == [MakeBranch(1, 6, 0)]
    assert m.branch_asked == {(0, 1, 6)}
    # the peer's draft first, then ours: asked when the pair is complete
    m.peer_draft(draft("device", 2, 7))
    assert kinds(m.own_draft(draft("cloud", 2, 8))) == ["SendDraft", "MakeBranch"]
    # no branch when the round trip is worth less than two decodes, or without "peer"
    quiet_ones = (machine("cloud", branch="peer", rtt=0.15), machine("cloud", rtt=0.6))
    for quiet in (*quiet_ones, machine("cloud", branch="own", rtt=0.6)):
        quiet.own_draft(draft("cloud", 0, 1))
        assert quiet.peer_draft(draft("device", 0, 2)) == []
    # the aggregator never branches: it learns every outcome first
    owner = machine(targets={0: 1}, branch="peer", rtt=0.6)
    owner.own_draft(draft("device", 1, 1))
    owner.peer_draft(draft("cloud", 1, 2))
    assert not owner.branch_asked


def test_a_branch_that_arrived_first_becomes_the_peers_draft_when_its_rejection_comes():
    m = machine(targets={0: 9, 1: 3}, branch="peer")  # the device aggregates
    m.own_draft(draft("device", 0, 9))
    m.own_draft(draft("device", 1, 3))
    # the cloud drafted 5 at 0 and 6 at 1, then its branch for 1 after the device's 9
    branch = draft("cloud", 1, 3, epoch=1, branch_of=(0, 9))
    assert m.peer_draft(branch) == []  # kept aside: position 0 is unresolved
    actions = m.peer_draft(draft("cloud", 0, 5))
    # 0 resolves to 9 (cloud rejected, epoch 1, its branch adopted), then 1 at once
    assert kinds(actions) == ["Committed", "SendTarget", "Decided"] * 2
    assert [a.position for a in actions if isinstance(a, Committed)] == [0, 1]
    assert m.committed == [9, 3] and m.epochs == {"device": 0, "cloud": 1}
    assert m.branches_adopted == {"device": 0, "cloud": 1}
    assert actions[0].adopted is None  # the device's own decoder adopted nothing


def test_a_branch_that_arrives_after_its_rejection_is_queued_at_once():
    m = machine(targets={0: 9, 1: 3}, branch="peer")
    m.own_draft(draft("device", 0, 9))
    m.own_draft(draft("device", 1, 3))
    m.peer_draft(draft("cloud", 0, 5))  # resolves 0: cloud rejected
    assert m.epochs["cloud"] == 1 and m.committed == [9]
    actions = m.peer_draft(draft("cloud", 1, 3, epoch=1, branch_of=(0, 9)))
    assert [a.position for a in actions if isinstance(a, Committed)] == [1]
    assert m.branches_adopted["cloud"] == 1


def test_a_branch_for_another_outcome_is_never_used():
    # an earlier rejection (position 0) starts epoch 1: a branch made for position 1 in
    # epoch 0 was drafted on the rejected prefix and must be dropped
    m = machine(targets={0: 9, 1: 3, 2: 4}, branch="peer")
    m.own_draft(draft("device", 0, 9))
    m.peer_draft(draft("cloud", 0, 5))  # cloud rejected at 0: epoch 1
    stale = draft("cloud", 2, 4, epoch=1, branch_of=(1, 3))  # made in epoch 0, for (1, 3)
    assert m.peer_draft(stale) == [] and m.drafts_dropped["cloud"] == 1
    assert not m.branches["cloud"]
    # a branch for a token that is not the target is dropped at the resolution
    m2 = machine(targets={0: 9, 1: 3}, branch="peer")
    m2.peer_draft(draft("cloud", 1, 7, epoch=1, branch_of=(0, 8)))  # after the token 8
    m2.own_draft(draft("device", 0, 9))
    m2.peer_draft(draft("cloud", 0, 5))
    assert m2.epochs["cloud"] == 1 and not m2.branches["cloud"] and len(m2.queues["cloud"]) == 0
    # and when the side's own draft is accepted there, its branch is simply forgotten
    m3 = machine(targets={0: 5}, branch="peer")
    m3.peer_draft(draft("cloud", 1, 7, epoch=1, branch_of=(0, 9)))
    m3.own_draft(draft("device", 0, 9))
    m3.peer_draft(draft("cloud", 0, 5))
    assert m3.epochs["cloud"] == 0 and not m3.branches["cloud"]


def test_the_side_adopts_its_own_branch_and_tells_its_decoder():
    m = machine("cloud", first="device", branch="peer", rtt=0.6)
    m.own_draft(draft("cloud", 0, 5))
    assert m.peer_draft(draft("device", 0, 9)) == [MakeBranch(0, 9, 0)]
    m.own_draft(draft("cloud", 1, 6))  # the main chain goes on
    branch = draft("cloud", 1, 3, epoch=1, branch_of=(0, 9))
    assert m.own_branch(branch) == [SendDraft(branch)] and m.branches_made == 1
    (committed,) = m.target(0, 9)  # the device aggregated 0 to its own token
    assert committed.accepted["cloud"] is False and committed.epoch == 1
    assert committed.adopted == 3 and m.queues["cloud"].at(1) == branch
    # a branch finished after its position resolved is not sent
    late = machine("cloud", first="device", branch="peer", rtt=0.6)
    late.own_draft(draft("cloud", 0, 5))
    late.peer_draft(draft("device", 0, 9))
    late.target(0, 9)
    assert late.own_branch(branch) == [] and late.drafts_dropped["cloud"] == 1


def test_own_branching_is_on_only_while_a_branch_pays():
    m = machine("cloud", first="device", branch="own", rtt=0.15)
    m.own_draft(draft("cloud", 0, 5))  # decodes of 0.1 s measured
    assert not m.own_branching()  # 0.15 s < 2 x 0.1 s
    m.rtt = lambda: 0.6
    assert m.own_branching()
    owner = machine("cloud", first="cloud", strategy="cloud", branch="own", rtt=0.6)
    owner.own_draft(draft("cloud", 0, 5))
    assert not owner.own_branching()  # the aggregator learns every outcome first
    peer = machine("cloud", first="device", branch="peer", rtt=0.6)
    peer.own_draft(draft("cloud", 0, 5))
    assert not peer.own_branching()


# ---- mirroring ----------------------------------------------------------------------------


def test_a_mirroring_aggregator_sends_no_verdicts_and_its_drafts_carry_stamps():
    m = machine(targets={0: 5, 1: 7, 2: 7}, mirror=True)
    (send,) = m.own_draft(draft("device", 0, 5))
    assert send.stamp == (0, 0)  # nothing resolved yet: the empty sequence's CRC
    assert kinds(m.peer_draft(draft("cloud", 0, 6))) == ["Committed", "Decided"]
    send, *rest = m.own_draft(draft("device", 1, 7))
    assert send.stamp == (1, prefix_crc(0, 5)) and kinds(rest) == []
    assert kinds(m.peer_draft(draft("cloud", 1, 7, epoch=1))) == ["Committed", "Decided"]
    assert m.crcs == [0, prefix_crc(0, 5), prefix_crc(prefix_crc(0, 5), 7)]
    # a switch is still sent: the peer must learn that it aggregates now
    moving = machine(targets={0: 1, 1: 1}, strategy="cloud", mirror=True)
    moving.own_draft(draft("device", 0, 1))
    assert kinds(moving.peer_draft(draft("cloud", 0, 1))) == ["Committed", "SendSwitch", "Decided"]
    # without mirroring: a verdict, and no stamp
    plain = machine(targets={0: 5})
    assert plain.own_draft(draft("device", 0, 5))[0].stamp is None
    assert "SendTarget" in kinds(plain.peer_draft(draft("cloud", 0, 6)))


def test_the_peers_stamps_are_checked_once_this_side_resolved_as_far():
    def side():
        m = machine("cloud", targets={0: 9, 1: 3}, first="device", mirror=True, tokens=4)
        m.own_draft(draft("cloud", 0, 9))
        return m

    good = [0, prefix_crc(0, 9), prefix_crc(prefix_crc(0, 9), 3)]
    m = side()
    m.peer_draft(draft("device", 0, 9), stamp=(0, 0))
    assert m.committed == [9] and not m.stamps
    m.peer_draft(draft("device", 1, 3), stamp=(2, good[2]))  # ahead: kept until reached
    assert len(m.stamps) == 1
    m.own_draft(draft("cloud", 1, 3))
    assert m.committed == [9, 3] and not m.stamps  # reached and matched
    # a stamp of a different sequence fails, at once or when it is reached
    wrong = side()
    wrong.peer_draft(draft("device", 0, 9))
    with pytest.raises(ValueError, match="first 1 target tokens differ"):
        wrong.peer_draft(draft("device", 1, 3), stamp=(1, prefix_crc(0, 8)))
    later = side()
    later.peer_draft(draft("device", 0, 9), stamp=(2, prefix_crc(prefix_crc(0, 9), 4)))
    later.peer_draft(draft("device", 1, 3))
    with pytest.raises(ValueError, match="first 2 target tokens differ"):
        later.own_draft(draft("cloud", 1, 3))
    with pytest.raises(ValueError, match="stamps 5 resolved"):
        side().peer_draft(draft("device", 0, 9), stamp=(5, 0))
    # a device that lost the link resolves alone, by another rule: the stamps it held go
    alone = machine(targets={0: 9}, first="cloud", mirror=True, tokens=4)
    alone.own_draft(draft("device", 0, 5))
    alone.peer_draft(draft("cloud", 0, 9), stamp=(2, prefix_crc(prefix_crc(0, 9), 4)))
    assert alone.committed == [9] and len(alone.stamps) == 1
    alone.link_lost()
    alone.own_draft(draft("device", 1, 7, epoch=1))
    assert alone.committed == [9, 7] and not alone.stamps


def test_the_side_that_does_not_aggregate_mirrors_and_a_verdict_confirms():
    m = machine("cloud", targets={0: 9, 1: 3}, first="device", mirror=True)
    assert kinds(m.own_draft(draft("cloud", 0, 5))) == ["SendDraft"]
    (committed,) = m.peer_draft(draft("device", 0, 9))  # both here: resolved at once
    assert committed == Committed(0, 9, "device", True, {"device": True, "cloud": False}, 1,
                                  {"device": 1.0, "cloud": 0.0})  # fmt: skip
    assert m.committed == [9] and m.epochs == {"device": 0, "cloud": 1} and m.mirrored == 1
    assert m.target(0, 9) == []  # the aggregator's verdict only confirms
    with pytest.raises(ValueError, match="mirrored 9"):
        m.target(0, 4)
    # a switch after a mirrored position moves the role and aggregates what is queued
    m.peer_draft(draft("device", 1, 3))
    actions = m.own_draft(draft("cloud", 1, 3, epoch=1))
    assert kinds(actions) == ["SendDraft", "Committed"] and m.committed == [9, 3]
    assert m.switch(1, 3, "cloud") == [] and m.aggregator == "cloud"
    # without mirroring the same side waits for the verdict
    waiting = machine("cloud", targets={0: 9}, first="device")
    waiting.own_draft(draft("cloud", 0, 5))
    assert waiting.peer_draft(draft("device", 0, 9)) == [] and waiting.committed == []


def test_the_first_aggregator_is_placed_before_any_position():
    """`place_first`: the cloud's pick at READY moves the aggregator before anything is
    resolved, with no switch and no wait; after a position it is a protocol error."""
    cloud = machine("cloud", targets={0: 4}, strategy="dragon", first="device")
    assert cloud.peer_draft(draft("device", 0, 4)) == []  # queued for the aggregator
    assert cloud.place_first("cloud") == [] and cloud.aggregator == "cloud"
    actions = cloud.own_draft(draft("cloud", 0, 4))
    assert kinds(actions)[:3] == ["SendDraft", "Committed", "SendTarget"]
    assert actions[1].by == "cloud" and cloud.switches == []
    with pytest.raises(ValueError, match="after 1 positions"):
        cloud.place_first("device")
    device = machine("device", targets={0: 4}, strategy="dragon", first="device")
    device.own_draft(draft("device", 0, 4))
    assert device.place_first("cloud") == [] and device.aggregator == "cloud"
    (committed,) = device.target(0, 4)
    assert committed.by == "cloud" and device.switches == []
