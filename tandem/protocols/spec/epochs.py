"""The epoch model: the decode rate of our pipelines (async, eager) from their own rules.

Eq. 9 (theory.py) prices one block in flight: every rejection costs a whole round. Our
pipelines keep several blocks in flight (device.py's lookahead), send a short first chunk
(fast verification), merge the chunks that wait at the cloud into one pass and, in "eager",
let the cloud decode on its own whenever no drafts are waiting. This model prices exactly
that, under the same assumptions as Eq. 9 (each draft matches the target's token with
probability alpha, independently; fixed costs), and nothing else.

Words used here (as in planner.py): t_draft = one draft step; a verification pass over n
drafts costs t_ar + n * decode_per_token (it feeds the pending token and the drafts, one
forward pass; an AR step is the pass with no drafts); h = rtt / 2 each way.

- *epoch*: from the moment the cloud commits a token the device did not draft (a rejection's
  residual, or in eager an AR token that differs from the device's draft) to the next such
  moment. The device hears of it h later and drafts a new chain after it.
- *mismatch-free schedule*: the epoch's timeline if every draft matched: when the device
  drafts position p (one step after p - 1, and not before it knows position p - L is
  committed: L = the lookahead), when each chunk leaves (positions c, then multiples of
  gamma, or a partial chunk after `truncate_factor` times its expected drafting time) and
  reaches the cloud (+ h), and when the cloud commits each position, C(p): at the end of the
  pass that verifies it (a pass takes every chunk waiting, merged), or, in eager, of the AR
  step that decodes it (the cloud runs AR steps while no drafts wait; a chunk that reaches
  past the step being decoded preempts it when less than `planner.preempt_threshold` has run,
  at the model's alpha; the first step after a fully accepted pass is free, the bonus
  token's role, and is taken before any chunk that waits).
- Nothing before the first mismatch depends on where it is, so if position X is the first
  draft that differs, the epoch commits X tokens and lasts C(X): P(X = p) = alpha^(p-1)
  (1 - alpha). Renewal-reward: rate = E[X] / E[C(X)], summed over p up to a horizon where
  alpha^p is negligible (an epoch reaching it ends there, as a generation would).

Branches (eager.py: *branch*) break the renewal argument twice: whether the draft at a
position opens one depends on the draft model's confidence there (and on whether one is open),
so the mismatch-free schedule depends on where the unsure drafts before X lie; and an epoch
whose mismatch had a branch holding the target's token starts *warm*: the branch is the next
chain, its drafts at the cloud already (or on their way). `branch_rate` therefore samples
consecutive epochs (X, each position unsure or not with the probability its outcome gives,
the branch at X taken or not) and prices each with `schedule`, which runs the rules above
plus: a draft that opens a branch is sent at once with the drafts before it, then the device
drafts the branch (`branch_len` steps, the chain waits) and sends it; at most one is open,
until the device knows its position committed; a warm epoch's branch drafts are verified in
one pass when they are at the cloud (preempting an AR step by the usual rule), and the device
drafts after them from the moment it hears of the epoch, its first chunk sent at once.

What it leaves out: serialization and scheduling delays, the end of a generation, the
first epoch's start (prefills: TTFT is measured apart), acceptance that comes in runs
(real traces are not i.i.d.; nor is confidence: a branch's own drafts are priced as if the
draft at each position matched with probability alpha, whatever opened the branch).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.protocols.spec.edge import auto_lookahead, chunk_boundary
from tandem.protocols.spec.planner import Branching, Costs, preempt_threshold

HORIZON = 2048  # most positions priced in one epoch
TAIL = 1e-6  # the horizon stops where alpha^p falls below this


def lookahead(gamma: int, costs: Costs) -> int:
    """The device's auto lookahead, from the model's own latency (RTT + a block's pass)."""
    latency = costs.rtt + costs.t_ar + costs.decode_per_token * gamma
    return auto_lookahead(latency, costs.t_draft, gamma)


@dataclass(frozen=True)
class Schedule:
    """One epoch's mismatch-free schedule: C(p) for p = 1..positions, and when each branch
    the device drafted in it reached the cloud (position -> seconds; eager with branches)."""

    commit: list[float]
    branch_arrival: dict[int, float]


def commit_times(pipeline: str, gamma: int, costs: Costs, positions: int, **options) -> list[float]:
    """C(1..positions) of the mismatch-free schedule of one epoch (module docstring; `options`
    as `schedule`'s: `alpha` is what eager's preemption rule assumes of the draft at the
    step's position)."""
    return schedule(pipeline, gamma, costs, positions, **options).commit


def schedule(
    pipeline: str,
    gamma: int,
    costs: Costs,
    positions: int,
    *,
    truncate_factor: float = 2.0,
    lookahead_drafts: int | None = None,
    alpha: float = 1.0,
    unsure: Sequence[bool] = (),
    branch_len: int = 0,
    warm: float | None = None,
    refeed_s: float = 0.0,
) -> Schedule:
    """`commit_times`, and eager's branches: `unsure[p - 1]` says the draft at position p opens
    a branch of `branch_len` drafts (if none is open); `warm`: the epoch starts with a taken
    branch (its `branch_len` drafts, positions 1.., reach the cloud at that time, <= 0: they
    wait there already; the device drafts after them, its first step `refeed_s` longer)."""
    if pipeline not in ("async", "eager"):
        raise ValueError(f"no epoch model for pipeline {pipeline!r}")
    if (branch_len or warm is not None) and pipeline != "eager":
        raise ValueError("branches need pipeline eager")
    c, h = costs, costs.rtt / 2
    ahead = lookahead_drafts or lookahead(gamma, c)
    first = c.first_chunk
    commit: list[float] = [0.0] * (positions + 1)  # commit[0]: the epoch's first token
    arrival: dict[int, float] = {}  # branch position -> when it reached the cloud
    base = min(branch_len, positions) if warm is not None else 0  # a taken branch's drafts
    known = 0  # the device's view of the committed frontier
    drafted = base  # positions drafted in this epoch
    sent = base  # positions sent
    chunk_started: float | None = None
    drafting = False
    refeed = refeed_s if warm is not None else 0.0  # the next draft step feeds the branch
    branch: int | None = None  # the position of the open branch
    frontier = 0  # the cloud's committed frontier
    waiting: list[int] = []  # chunk ends that reached the cloud, not yet taken
    step: tuple[str, float, float, int] | None = None  # cloud: (kind, start, end, end position)
    free_step = False  # eager: the next AR step costs nothing (after a fully accepted pass)
    events: list[tuple[float, int, str, int]] = []
    order = 0

    def push(time: float, kind: str, value: int = 0) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (time, order, kind, value))

    def boundary() -> int:
        return base + chunk_boundary(sent - base, gamma, first)

    def send(now: float, end: int) -> None:
        nonlocal sent, chunk_started
        sent, chunk_started = end, None
        push(now + h, "arrive", end)

    def device(now: float) -> None:
        """Send what is due, then draft one more if the lookahead allows."""
        nonlocal drafting, chunk_started, refeed
        if drafting or drafted >= positions:
            if drafted > sent and drafted >= positions:
                send(now, drafted)
            return
        if drafted > sent and drafted >= boundary():
            send(now, drafted)
        if drafted + 1 <= known + ahead:
            if chunk_started is None:
                chunk_started = now
            drafting = True
            push(now + c.t_draft + refeed, "drafted", drafted + 1)
            refeed = 0.0
        elif drafted > sent and chunk_started is not None and truncate_factor:
            push(chunk_started + truncate_factor * (boundary() - sent) * c.t_draft, "trunc", sent)

    def opens_branch(p: int) -> bool:
        """The draft at p opens a branch (eager.py: *branch*): unsure there, none open (one
        is open until the device knows its position committed), not the last position."""
        return (
            branch_len > 0
            and p - 1 < len(unsure)
            and unsure[p - 1]
            and (branch is None or known >= branch)
            and p < positions
        )

    def cloud(now: float) -> None:
        """Start the cloud's next pass or AR step when it is free."""
        nonlocal step, free_step
        if step is not None or frontier >= positions:
            return
        end = max(waiting, default=0)
        if pipeline == "eager" and free_step:  # free step first, before the waiting chunks
            free_step = False
            step = ("ar", now, now, frontier + 1)
            push(now, "done", frontier + 1)
            return
        waiting.clear()
        if end > frontier:
            n = end - frontier
            step = ("verify", now, now + c.t_ar + c.decode_per_token * n, end)
        elif pipeline == "eager":
            step = ("ar", now, now + c.t_ar, frontier + 1)
        else:
            return
        push(step[2], "done", step[3])

    push(h, "known", 0)
    if warm is not None and base:
        if warm <= 0.0:
            waiting.append(base)  # the taken branch waits at the cloud already
        else:
            push(warm, "arrive", base)
    cloud(0.0)
    while events and frontier < positions:
        now, _, kind, value = heapq.heappop(events)
        if kind == "drafted":
            drafting = False
            drafted = value
            if opens_branch(value):  # send the drafts so far, then draft the branch
                branch = value
                if drafted > sent:
                    send(now, drafted)
                drafting = True
                push(now + branch_len * c.t_draft, "branched", value)
                continue
            device(now)
        elif kind == "branched":
            drafting = False
            arrival[value] = now + h  # stale at the cloud unless the chain dies there
            device(now)
        elif kind == "known":
            known = max(known, value)
            device(now)
        elif kind == "trunc":
            if sent == value and drafted > sent and not drafting:
                send(now, drafted)
        elif kind == "arrive":
            waiting.append(value)
            if step is not None and step[0] == "ar" and value > step[3]:
                threshold = preempt_threshold(c.t_ar, c.decode_per_token, alpha, value - frontier)
                if now - step[1] < threshold:  # preempt: the step's work is lost
                    step = None
            cloud(now)
        elif kind == "done":
            if step is None or step[2] != now or step[3] != value:
                continue  # a preempted step's end
            kind_done = step[0]
            step = None
            for p in range(frontier + 1, min(value, positions) + 1):
                commit[p] = now
            frontier = min(value, positions)
            free_step = pipeline == "eager" and kind_done == "verify"
            push(now + h, "known", frontier)
            cloud(now)
    return Schedule(commit=commit[1:], branch_arrival=arrival)


def rate(
    pipeline: str,
    alpha: float,
    gamma: int,
    costs: Costs,
    *,
    truncate_factor: float = 2.0,
    lookahead_drafts: int | None = None,
) -> float:
    """Predicted decode rate (tokens/s): E[X] / E[C(X)] (module docstring)."""
    if alpha >= 1.0:
        horizon = HORIZON
    else:
        horizon = min(
            HORIZON, max(gamma + 1, math.ceil(math.log(TAIL) / math.log(max(alpha, 1e-9))))
        )
    times = commit_times(pipeline, gamma, costs, horizon, truncate_factor=truncate_factor,
                         lookahead_drafts=lookahead_drafts, alpha=alpha)  # fmt: skip
    tokens = duration = 0.0
    for p, t in enumerate(times, start=1):
        weight = alpha ** (p - 1) * (1.0 - alpha) if p < horizon else alpha ** (p - 1)
        tokens += weight * p
        duration += weight * t
    return tokens / duration


def branch_rate(
    alpha: float,
    gamma: int,
    costs: Costs,
    branching: Branching,
    *,
    epochs: int = 4000,
    seed: int = 0,
    truncate_factor: float = 2.0,
    lookahead_drafts: int | None = None,
) -> float:
    """Predicted decode rate (tokens/s) of eager with branches. An epoch's schedule now depends
    on where the drafts before its mismatch were unsure (they open branches, each costing the
    device `length` draft steps), and on the epoch before it (a taken branch starts it warm),
    so instead of the sum over X of `rate`, `epochs` consecutive epochs are sampled (seeded:
    the same figure every call): X ~ geometric, each position unsure with its outcome's
    probability, the branch at X taken with probability `second`; rate = sum X / sum C(X).
    With no unsure positions it estimates `rate("eager", ...)` (a sampling error of about 1%
    at 4000 epochs). Two seeded streams (X and flags; taken or not) make calls with the same
    `seed` price the same epochs, so the ratio of two calls that differ in `branching` only is
    much less noisy than either."""
    b = branching
    rng = random.Random(seed)  # X and the flags: the same epochs whatever `branching` says
    taking = random.Random(seed + 1)  # whether a branch at X holds the target's token
    margin = (lookahead_drafts or lookahead(gamma, costs)) + 2 * gamma + b.length
    unsure_any = alpha * b.unsure_match + (1.0 - alpha) * b.unsure_miss
    warm: float | None = None
    tokens = duration = 0.0
    for _ in range(epochs):
        x = 1
        while x < HORIZON and rng.random() < alpha:
            x += 1
        flags = [rng.random() < b.unsure_match for _ in range(x - 1)]
        flags.append(rng.random() < b.unsure_miss)
        flags += [rng.random() < unsure_any for _ in range(margin)]
        epoch = schedule("eager", gamma, costs, x + margin, truncate_factor=truncate_factor,
                         lookahead_drafts=lookahead_drafts, alpha=alpha, unsure=flags,
                         branch_len=b.length, warm=warm, refeed_s=b.refeed_s)  # fmt: skip
        end = epoch.commit[x - 1]
        tokens, duration = tokens + x, duration + end
        taken = x in epoch.branch_arrival and taking.random() < b.second
        warm = epoch.branch_arrival[x] - end if taken else None
    return tokens / duration


def branch_gain(
    alpha: float, gamma: int, costs: Costs, branching: Branching, *, epochs: int = 400
) -> float:
    """How much faster eager runs with branches than without, by `branch_rate` over the same
    sampled epochs (the ratio's sampling error is about 1.5% at 400 epochs: 0.1-0.3 s)."""
    off = Branching(0.0, 0.0, 0.0, branching.length, branching.refeed_s)
    return branch_rate(alpha, gamma, costs, branching, epochs=epochs) / branch_rate(
        alpha, gamma, costs, off, epochs=epochs
    )
