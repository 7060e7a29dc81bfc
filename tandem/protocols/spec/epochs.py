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

What it leaves out: serialization and scheduling delays, the end of a generation, the
first epoch's start (prefills: TTFT is measured apart), acceptance that comes in runs
(real traces are not i.i.d.).
"""

from __future__ import annotations

import heapq
import math

from tandem.protocols.spec.edge import auto_lookahead, chunk_boundary
from tandem.protocols.spec.planner import Costs, preempt_threshold

HORIZON = 2048  # most positions priced in one epoch
TAIL = 1e-6  # the horizon stops where alpha^p falls below this


def lookahead(gamma: int, costs: Costs) -> int:
    """The device's auto lookahead, from the model's own latency (RTT + a block's pass)."""
    latency = costs.rtt + costs.t_ar + costs.decode_per_token * gamma
    return auto_lookahead(latency, costs.t_draft, gamma)


def commit_times(
    pipeline: str,
    gamma: int,
    costs: Costs,
    positions: int,
    *,
    truncate_factor: float = 2.0,
    lookahead_drafts: int | None = None,
    alpha: float = 1.0,
) -> list[float]:
    """C(1..positions) of the mismatch-free schedule of one epoch (module docstring); `alpha`
    is what eager's preemption rule assumes of the draft at the step's position."""
    if pipeline not in ("async", "eager"):
        raise ValueError(f"no epoch model for pipeline {pipeline!r}")
    c, h = costs, costs.rtt / 2
    ahead = lookahead_drafts or lookahead(gamma, c)
    first = c.first_chunk
    commit: list[float] = [0.0] * (positions + 1)  # commit[0]: the epoch's first token
    known = 0  # the device's view of the committed frontier
    drafted = 0  # positions drafted in this epoch
    sent = 0  # positions sent
    chunk_started: float | None = None
    drafting = False
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
        return chunk_boundary(sent, gamma, first)

    def send(now: float, end: int) -> None:
        nonlocal sent, chunk_started
        sent, chunk_started = end, None
        push(now + h, "arrive", end)

    def device(now: float) -> None:
        """Send what is due, then draft one more if the lookahead allows."""
        nonlocal drafting, chunk_started
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
            push(now + c.t_draft, "drafted", drafted + 1)
        elif drafted > sent and chunk_started is not None and truncate_factor:
            push(chunk_started + truncate_factor * (boundary() - sent) * c.t_draft, "trunc", sent)

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
    cloud(0.0)
    while events and frontier < positions:
        now, _, kind, value = heapq.heappop(events)
        if kind == "drafted":
            drafting = False
            drafted = value
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
    return commit[1:]


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
