"""One side of Speculative Aggregation as a sans-I/O state machine: events in, actions out.

Why one file: every rule below reads and writes the same state (both draft queues, the
epochs, the kept branch drafts, who aggregates, what is committed), and each event runs
several rules in a fixed order; split, each part would need all of it.

No asyncio, no threads, no clock, no sockets (h11's shape). The live side
(`session.DragonSide`) feeds it the drafts its decoder makes and the messages the peer sends,
and carries out the actions it returns; the Fig. 8 replay (`benchmarks/dragon_sched`) feeds
the same machine on virtual time. So the rules below exist once.

Words used here (see `session.py` for the whole picture):
- *committed*: the target tokens resolved so far, identical on both sides.
- *aggregator*: the side that runs Algorithm 1 now; it resolves a position as soon as both
  drafts for it are queued, then asks the scheduler who aggregates the next one.
- *rule*: how a pair of drafts becomes the target token, and what acceptance rates the
  scheduler's tracker learns from it (`SpeculativeAggregation` live; a replay passes its
  recorded outcomes).
- *epoch*: rejections of a side's drafts so far; a draft of an older epoch is stale.

Events (methods) and what they do:

    own_draft(d)        queue it, send it to the peer, try to aggregate
    own_branch(d)       keep it (until its position is resolved), send it to the peer
    peer_draft(d)       drop if stale, else queue it (a branch draft: keep it, or queue it
                        if the rejection it waits for already happened), try to aggregate
    target(t, x)        the peer aggregated position t to x: resolve (or, if this side
                        mirrored t already, check that it found x too)
    switch(t, x, side)  the same, and `side` aggregates from t + 1 on
    link_lost(reason)   device: degrade (its own drafts become the target tokens, no token
                        lost); cloud: finish ("aborted")

Actions (returned in the order they must happen): `SendDraft`, `SendTarget`, `SendSwitch`
(to the peer), `Committed` (a position is resolved: tell the decoder, show the token),
`Decided` (the scheduler's inputs and output, for the report), `MakeBranch` (ask the decoder
for a branch draft), `Finished` (length, eos or aborted). After `Finished` every event
returns no action.

Mirroring (`mirror=True`). Both sides hold both draft queues with the laws as sent, and
Algorithm 1 draws from the position seed, so the side that does not aggregate can run the
same rule on the same two drafts the moment it holds both, instead of waiting for the
aggregator's verdict a one-way trip later. A rejected side thus learns of it as soon as the
peer's draft arrives, and a switch of the aggregator costs the resolutions nothing, so the
"dragon" scheduler keeps the aggregator where it is (scheduler.py, *mirrored*); the controls
("random", ...) still move it, with the same output (the same rule on the same inputs). A
verdict would only confirm, so none is sent: instead every draft carries a *stamp* `(n,
crc)`, its side's resolved count and the CRC-32 of those n tokens (`prefix_crc`), and each
side checks the peer's stamps against its own resolutions as it reaches n (a mismatch
raises). Both sides thus check each other, at no extra message; the positions resolved after
a side's last draft are not compared (its drafts run ahead of the resolutions, so that is up
to a lookahead's worth at the end of a session; the verdicts that ended a session were not
read either, the mirroring side being done first).

Branch drafts (`branch`; queues.py defines them). A side that does not aggregate learns
that its draft at t was rejected a one-way trip after the aggregator knew, and only then
decodes the target token and sends its next draft: the aggregator waits a round trip plus a
decode. So the side also drafts t + 1 after another token x at t, on a copy of its rows, and
sends it at once: after the peer's draft at t where it differs from its own ("peer":
`MakeBranch` when the pair is complete), or after its own second choice where its draft is
unsure ("own": the worker asks itself while `own_branching()`). Either way only while the
round trip it may save exceeds `BRANCH_RTT_FACTOR` decodes it costs. Both machines keep branch
drafts aside; when a side's draft at t is rejected with target x, its branch (t, x) becomes
the first draft of its new epoch on both sides (`Committed.adopted` tells the decoder), so the
aggregator can resolve t + 1 without waiting for a redraft. Which draft is used never changes
what is drawn: the branch is drawn with the same position seed from the side's law after the
same prefix, so the output is the one without branches (timing only).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tandem.protocols.dragon.aggregator import aggregate_step, expected_acceptance
from tandem.protocols.dragon.config import CLOUD, DEVICE, SIDES, peer_of
from tandem.protocols.dragon.profiler import AcceptanceTracker, LatencyModel
from tandem.protocols.dragon.queues import Draft, DraftQueue
from tandem.protocols.dragon.scheduler import Decision, Estimates, Scheduler

# a side branches when the round trip it may save exceeds this many of its own decodes (a
# branch is used only when its token wins: about half the time, or less)
BRANCH_RTT_FACTOR = 2.0


def prefix_crc(previous: int, token: int) -> int:
    """CRC-32 of a resolved sequence extended by `token` (each token as 4 little-endian
    bytes; the empty sequence's is 0)."""
    return zlib.crc32(token.to_bytes(4, "little"), previous)


class Rule(Protocol):
    def aggregate(self, device: Draft, cloud: Draft) -> int:
        """The target token of the drafts' position."""

    def rates(self, device: Draft, cloud: Draft, accepted: dict[str, bool]) -> dict[str, float]:
        """What the acceptance tracker learns from one aggregated position."""


@dataclass(frozen=True)
class SpeculativeAggregation:
    """Algorithm 1 (the live rule): greedy rates are the 0/1 outcomes, sampled ones Eq. 5."""

    seed: int
    greedy: bool

    def aggregate(self, device: Draft, cloud: Draft) -> int:
        return aggregate_step(device, cloud, seed=self.seed, greedy=self.greedy).token

    def rates(self, device: Draft, cloud: Draft, accepted: dict[str, bool]) -> dict[str, float]:
        if self.greedy:
            return {side: float(accepted[side]) for side in SIDES}
        return expected_acceptance(device, cloud)


@dataclass(frozen=True)
class SendDraft:
    draft: Draft
    stamp: tuple[int, int] | None = None  # (resolved count, its prefix_crc), when mirroring


@dataclass(frozen=True)
class SendTarget:
    position: int
    token: int
    accepted: dict[str, bool]


@dataclass(frozen=True)
class SendSwitch:
    position: int
    token: int
    aggregator: str  # the side that aggregates position + 1 on


@dataclass(frozen=True)
class Committed:
    position: int
    token: int
    by: str  # the side whose aggregation (or fallback) resolved it
    aggregated: bool  # both drafts were here (not a degraded or a peer-only resolution)
    accepted: dict[str, bool]  # side -> its queued draft equalled the token
    epoch: int  # this side's epoch after the resolution (the decoder rolls back to it)
    rates: dict[str, float] | None = None  # what the acceptance tracker learnt (if aggregated)
    adopted: int | None = None  # this side's branch draft token now queued at position + 1


@dataclass(frozen=True)
class MakeBranch:
    position: int  # t: the decoder drafts t + 1 after its own chain up to t - 1 and `token`
    token: int  # the peer's draft at t
    epoch: int  # this side's epoch now (the branch belongs to epoch + 1)


@dataclass(frozen=True)
class Decided:
    position: int
    decision: Decision
    estimates: Estimates | None


@dataclass(frozen=True)
class Finished:
    reason: str  # "length" | "eos" | "aborted"


Action = SendDraft | SendTarget | SendSwitch | Committed | Decided | MakeBranch | Finished


class SideMachine:
    def __init__(
        self,
        role: str,
        *,
        rule: Rule,
        scheduler: Scheduler,
        first_aggregator: str,
        max_new_tokens: int,
        latency: dict[str, LatencyModel],
        rtt: Callable[[], float],
        acceptance_ema: float,
        slope_weight: float,
        eos_id: int | None = None,
        branch: str = "off",
        mirror: bool = False,
    ):
        """`latency`: the starting decode-cost model of each side (updated from every draft
        seen); `rtt`: the driver's current round-trip estimate for one aggregation (seconds),
        read when the scheduler decides and before asking for a branch; `branch`: which
        branch drafts to make, "off" | "peer" | "own"; `mirror`: resolve without waiting
        for the aggregator (module docstring)."""
        self.role, self.peer = role, peer_of(role)
        self.rule, self.scheduler, self.rtt = rule, scheduler, rtt
        self.max_new_tokens, self.eos_id = max_new_tokens, eos_id
        self.latency, self.slope_weight = latency, slope_weight
        self.tracker = AcceptanceTracker(acceptance_ema)
        self.aggregator = first_aggregator
        self.queues = {side: DraftQueue() for side in SIDES}
        self.epochs = dict.fromkeys(SIDES, 0)
        self.last_context = dict.fromkeys(SIDES, 0)
        self.committed: list[int] = []
        self.degraded = False
        self.degraded_at: int | None = None
        self.finished: str | None = None
        self.drafts_made = 0
        self.drafts_dropped = dict.fromkeys(SIDES, 0)
        self.switches: list[tuple[int, str]] = []  # (position, new aggregator)
        self.decode_times: dict[str, list[tuple[int, float]]] = {side: [] for side in SIDES}
        self.branch, self.mirror = branch, mirror
        self.mirrored = 0  # positions this side resolved without the aggregator's verdict
        self.crcs = [0]  # prefix_crc of committed[:n] at index n
        self.stamps: deque[tuple[int, int]] = deque()  # the peer's, ahead of committed
        self.branches: dict[str, dict[tuple[int, int], Draft]] = {side: {} for side in SIDES}
        # side -> (epoch, position, token) of the rejection that started its current epoch
        self.last_rejection: dict[str, tuple[int, int, int] | None] = dict.fromkeys(SIDES)
        self.branch_asked: set[tuple[int, int, int]] = set()  # (epoch, t, x) asked for
        self.branches_made = 0
        self.branches_adopted = dict.fromkeys(SIDES, 0)

    # ---- events -----------------------------------------------------------------------

    def own_draft(self, draft: Draft) -> list[Action]:
        if self.finished or draft.epoch != self.epochs[self.role]:
            self.drafts_dropped[self.role] += 1
            return []
        self.queues[self.role].push(draft)
        self.drafts_made += 1
        self._observe(draft)
        return [self._send(draft), *self._aggregate(), *self._maybe_branch(draft.position)]

    def own_branch(self, draft: Draft) -> list[Action]:
        """A branch draft from this side's decoder: kept aside and sent, unless the epoch it
        was made in is over (its position resolved, or an earlier rejection)."""
        assert draft.branch_of is not None and draft.side == self.role, draft
        if self.finished or self.degraded or not self._branch_pending(self.role, draft):
            self.drafts_dropped[self.role] += 1
            return []
        self.branches[self.role][draft.branch_of] = draft
        self.branches_made += 1
        self._observe(draft)
        return [self._send(draft)]

    def peer_draft(self, draft: Draft, stamp: tuple[int, int] | None = None) -> list[Action]:
        """`stamp`: the one the peer sent with it (mirroring), checked here."""
        if self.finished:
            return []
        if stamp is not None:
            if stamp[0] > self.max_new_tokens:
                raise ValueError(f"the peer stamps {stamp[0]} resolved tokens")
            self.stamps.append(stamp)
            self._check_stamps()
        if draft.branch_of is not None:
            return self._peer_branch(draft)
        expected = self.epochs[self.peer]
        if draft.epoch > expected:
            raise ValueError(f"draft from epoch {draft.epoch}, expected {expected}")
        if draft.epoch < expected or draft.position < len(self.committed):
            self.drafts_dropped[self.peer] += 1
            return []
        self.queues[self.peer].push(draft)
        self._observe(draft)
        return [*self._aggregate(), *self._maybe_branch(draft.position)]

    def target(self, position: int, token: int) -> list[Action]:
        if self.finished:
            return []
        if self.aggregator == self.role:
            raise ValueError("target token from the peer while this side aggregates")
        if self.mirror and position < len(self.committed):  # mirrored: the verdict confirms
            if self.committed[position] != token:
                raise ValueError(
                    f"target {token} at position {position}, mirrored {self.committed[position]}"
                )
            return []
        if position != len(self.committed):
            raise ValueError(f"target for position {position}, expected {len(self.committed)}")
        return self._resolve(position, token, by=self.peer)

    def place_first(self, aggregator: str) -> list[Action]:
        """`aggregator` resolves from position 0 on: the cloud's pick at READY
        (`Scheduler.first`), which the device learns before any cloud draft, so neither side
        can have resolved a position yet. Not a switch: nobody waits for a message."""
        if self.committed:
            raise ValueError(f"first aggregator placed after {len(self.committed)} positions")
        if self.finished or self.degraded:
            return []
        self.aggregator = aggregator
        return self._aggregate() if aggregator == self.role else []

    def switch(self, position: int, token: int, aggregator: str) -> list[Action]:
        if self.finished:
            return []
        actions = self.target(position, token)
        self.switches.append((position, aggregator))
        if aggregator == self.role:
            self.aggregator = self.role
            actions += self._aggregate()
        return actions

    def link_lost(self) -> list[Action]:
        if self.finished:
            return []
        if self.role != DEVICE:
            self.finished = "aborted"
            return [Finished("aborted")]
        if not self.degraded:
            self.degraded, self.degraded_at = True, len(self.committed)
            self.aggregator = self.role
            self.stamps.clear()  # from here on this side resolves alone, by another rule
        return self._aggregate()

    # ---- the rules --------------------------------------------------------------------

    def estimates(self) -> Estimates:
        c_dec = {side: self.latency[side].predict(self.last_context[side] + 1) for side in SIDES}
        return Estimates(c_dec=c_dec, alpha=self.tracker.alpha(), rtt=self.rtt())

    def _observe(self, draft: Draft) -> None:
        self.latency[draft.side].update(draft.context, draft.decode_s, self.slope_weight)
        self.last_context[draft.side] = draft.context
        self.decode_times[draft.side].append((draft.context, draft.decode_s))

    def _branch_pending(self, side: str, draft: Draft) -> bool:
        """The branch (t, x) of `side` can still be adopted: t is unresolved and `side` is
        in the epoch the branch was made in."""
        t, _ = draft.branch_of
        return t >= len(self.committed) and draft.epoch == self.epochs[side] + 1

    def _peer_branch(self, draft: Draft) -> list[Action]:
        t, token = draft.branch_of
        if not self.degraded and self._branch_pending(self.peer, draft):
            self.branches[self.peer][draft.branch_of] = draft
            self._observe(draft)
            return []
        started = self.last_rejection[self.peer]
        if (  # it arrived after the rejection it waits for: the peer adopted it too
            not self.degraded
            and started == (draft.epoch, t, token)
            and draft.epoch == self.epochs[self.peer]
            and draft.position == len(self.committed)
            and not len(self.queues[self.peer])
        ):
            self.queues[self.peer].push(draft)
            self.branches_adopted[self.peer] += 1
            self._observe(draft)
            return [*self._aggregate(), *self._maybe_branch(draft.position)]
        self.drafts_dropped[self.peer] += 1
        return []

    def own_branching(self) -> bool:
        """Whether the decoder should branch on its own unsure drafts now (`branch="own"`)."""
        return self.branch == "own" and self._branch_pays()

    def _branch_pays(self) -> bool:
        """This side does not aggregate, and the round trip a branch may save is worth the
        decode it costs."""
        if self.finished or self.degraded or self.aggregator == self.role:
            return False
        own_decode = self.latency[self.role].predict(self.last_context[self.role] + 1)
        return self.rtt() >= BRANCH_RTT_FACTOR * own_decode

    def _maybe_branch(self, position: int) -> list[Action]:
        """`MakeBranch` (`branch="peer"`) when both drafts at `position` are here and differ
        and a branch pays."""
        if self.branch != "peer" or self.finished or self.degraded:
            return []
        mine, theirs = self.queues[self.role].at(position), self.queues[self.peer].at(position)
        if mine is None or theirs is None or mine.token == theirs.token:
            return []
        key = (self.epochs[self.role], position, theirs.token)
        if key in self.branch_asked or position + 1 >= self.max_new_tokens:
            return []
        if theirs.token == self.eos_id or not self._branch_pays():  # nothing follows eos
            return []
        self.branch_asked.add(key)
        return [MakeBranch(position, theirs.token, self.epochs[self.role])]

    def _aggregate(self) -> list[Action]:
        actions: list[Action] = []
        while not self.finished and self.aggregator == self.role:
            position = len(self.committed)
            mine = self.queues[self.role].front_at(position)
            if mine is None:
                break
            if self.degraded:  # the local law alone: the draft is a sample of it
                actions += self._resolve(position, mine.token, by=self.role)
                continue
            token = self._aggregate_at(position)
            if token is None:
                break
            resolved = self._resolve(position, token, by=self.role)
            actions += resolved
            estimates = None if self.finished else self.estimates()
            if estimates is None:  # the last position never moves the aggregator
                decision = Decision(self.role, 0.0)
            else:
                decision = self.scheduler.decide(self.role, position, estimates)
            if decision.aggregator != self.role:
                actions.append(SendSwitch(position, token, decision.aggregator))
                self.switches.append((position, decision.aggregator))
            elif not self.mirror:  # mirroring: the peer resolved it too (stamps check it)
                actions.append(SendTarget(position, token, resolved[0].accepted))
            actions.append(Decided(position, decision, estimates))
            self.aggregator = decision.aggregator
        return actions + self._mirror()

    def _aggregate_at(self, position: int) -> int | None:
        """The rule's target token at `position`, None until both drafts are here."""
        drafts = {side: self.queues[side].front_at(position) for side in SIDES}
        if None in drafts.values():
            return None
        return self.rule.aggregate(drafts[DEVICE], drafts[CLOUD])

    def _send(self, draft: Draft) -> SendDraft:
        if not self.mirror:
            return SendDraft(draft)
        return SendDraft(draft, (len(self.committed), self.crcs[-1]))

    def _check_stamps(self) -> None:
        """The peer's stamps that this side's resolutions have reached must match them."""
        while self.stamps and self.stamps[0][0] < len(self.crcs):
            n, crc = self.stamps.popleft()
            if self.crcs[n] != crc:
                raise ValueError(
                    f"the peer's first {n} target tokens differ from the ones resolved here"
                )

    def _mirror(self) -> list[Action]:
        """Resolve, on the side that does not aggregate, every position whose two drafts are
        here (`mirror`): what the aggregator's rule gives, without its verdict."""
        actions: list[Action] = []
        while self.mirror and not (self.finished or self.degraded or self.aggregator == self.role):
            position = len(self.committed)
            token = self._aggregate_at(position)
            if token is None:
                break
            actions += self._resolve(position, token, by=self.aggregator)
            self.mirrored += 1
        return actions

    def _resolve(self, position: int, token: int, *, by: str) -> list[Action]:
        """`Committed` first (with each side's outcome), then `Finished` if this was the last."""
        drafts = {side: self.queues[side].front_at(position) for side in SIDES}
        accepted = {side: d is not None and d.token == token for side, d in drafts.items()}
        adopted: int | None = None
        for side in SIDES:
            if accepted[side]:
                self.queues[side].pop()
                continue
            self.queues[side].clear()
            self.epochs[side] += 1
            self.last_rejection[side] = (self.epochs[side], position, token)
            branch = self.branches[side].pop((position, token), None)
            if branch is not None and branch.epoch == self.epochs[side] and not self.degraded:
                self.queues[side].push(branch)
                self.branches_adopted[side] += 1
                if side == self.role:
                    adopted = branch.token
        for side in SIDES:  # branches at this position or before can no longer be adopted
            self.branches[side] = {k: d for k, d in self.branches[side].items() if k[0] > position}
        aggregated = not self.degraded and all(d is not None for d in drafts.values())
        rates = None
        if aggregated:
            rates = self.rule.rates(drafts[DEVICE], drafts[CLOUD], accepted)
            self.tracker.observe(rates, accepted)
        self.committed.append(token)
        self.crcs.append(prefix_crc(self.crcs[-1], token))
        self._check_stamps()
        actions: list[Action] = [
            Committed(
                position, token, by, aggregated, accepted, self.epochs[self.role], rates, adopted
            )
        ]
        if self.eos_id is not None and token == self.eos_id:
            self.finished = "eos"
        elif len(self.committed) >= self.max_new_tokens:
            self.finished = "length"
        if self.finished:
            actions.append(Finished(self.finished))
        return actions
