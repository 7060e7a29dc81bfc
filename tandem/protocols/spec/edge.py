"""PicoSpec's device-side pipeline rules as a sans-I/O state object: no asyncio, no clock.

`device.DeviceSession` pumps it: it tells the machine what happened (a draft step took so
long, a verdict came back after so long, a rejection restarted drafting, a chunk went out)
and asks it what to do next (`next_action`: send the chunk, wait for a verdict, or draft one
more token), how far ahead to draft (`lookahead`) and how long a slow partial chunk may wait
(`truncation_timeout`). Times are passed in (`now`, seconds on any monotonic clock), so the
rules are tested without a model, a network or a clock (tests/protocols/spec/test_edge.py).

Words: the *drafter* is the `spec.drafter.Drafter` state object (read only here: its
frontier, drafts sent and unsent, whether it may draft); an *epoch* starts at every
rejection, the first chunk of an epoch may be short (fast verification, `first_chunk`);
`gamma` is the current block length (the controller may re-plan it each round, eager only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.planner import Controller

Action = Literal["send", "wait", "draft"]
EMA = 0.3  # weight of the newest sample in the step-time and latency averages


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


@dataclass
class EdgeMachine:
    config: SpecConfig
    controller: Controller | None = None  # eager: re-plans gamma and drafting each round
    eager: bool = False
    gamma: int = 0  # the current block length (0: config.draft_len)
    speculate: bool = True  # eager: False = let the cloud's AR stream run alone
    epoch_start: int = 0  # the drafter's frontier when the current epoch began
    step_ema: float | None = None  # draft step seconds
    latency_ema: float | None = None  # request sent -> verdict received, seconds
    chunk_started: float | None = None  # when drafting the current chunk began (`now`)

    def __post_init__(self) -> None:
        self.gamma = self.gamma or self.config.draft_len

    # ---- events ---------------------------------------------------------------------------

    def step_timed(self, seconds: float) -> None:
        """A draft step (a forward pass of the draft model) took `seconds`."""
        self.step_ema = _ema(self.step_ema, seconds)

    def verdict_latency(self, seconds: float) -> None:
        """A verdict arrived `seconds` after its request was sent."""
        self.latency_ema = _ema(self.latency_ema, seconds)

    def rejected(self, frontier: int) -> None:
        """A rejection (or an adopted token that differs) restarted drafting at `frontier`."""
        self.epoch_start = frontier
        self.chunk_started = None

    def chunk_sent(self) -> None:
        self.chunk_started = None

    def drafting(self, now: float) -> None:
        """A draft step starts at `now`: the current chunk's clock starts with its first."""
        if self.chunk_started is None:
            self.chunk_started = now

    def replan(self) -> None:
        """Eager with a controller: this round's block length, and whether to draft at all."""
        if self.controller is None or not self.eager:
            return
        plan = self.controller.plan(("ar", "eager"))
        self.speculate = plan.method != "ar"
        self.gamma = plan.gamma if plan.gamma else self.gamma

    # ---- decisions ------------------------------------------------------------------------

    def next_action(self, drafter) -> Action:
        """Async pipeline: send the chunk when it is due, else draft if the drafter may (and
        the plan says to speculate), else wait for a verdict."""
        if self.chunk_due(drafter):
            return "send"
        if not drafter.can_draft() or not self.speculate:
            return "wait"
        return "draft"

    def boundary(self, drafter) -> int:
        """Tokens drafted in this epoch at which the current chunk is due."""
        sent = drafter.frontier + drafter.sent - self.epoch_start
        first = self.config.first_chunk if self.config.fast_verify else self.gamma
        return chunk_boundary(sent, self.gamma, first)

    def chunk_due(self, drafter) -> bool:
        if drafter.unsent == 0:
            return False
        drafted = drafter.frontier + len(drafter.drafts) - self.epoch_start
        idle = drafter.sent == 0 and not drafter.can_draft()  # nothing in flight to wait for
        return drafted >= self.boundary(drafter) or drafter.exhausted() or idle

    def truncation_timeout(self, drafter, now: float) -> float | None:
        """Seconds from `now` until the partial chunk should go (latency-aware truncation),
        or None (no truncation, nothing unsent, no step measured yet)."""
        if not self.config.truncate_factor or self.step_ema is None or not drafter.unsent:
            return None
        if self.chunk_started is None:
            return None
        remaining = self.boundary(drafter) - (drafter.frontier + drafter.sent - self.epoch_start)
        expected = self.config.truncate_factor * remaining * self.step_ema
        return max(0.0, self.chunk_started + expected - now)

    def lookahead(self) -> int:
        """Drafts to hold so that drafting never stalls waiting for a verdict: a block plus
        what the device drafts during one request's round trip (RTT + T_verify), measured;
        between 2 and 8 blocks (PicoSpec's consecutive pre-drafts). A configured
        `lookahead_blocks` wins."""
        if self.config.lookahead_blocks or not self.latency_ema or not self.step_ema:
            return self.config.lookahead
        return auto_lookahead(self.latency_ema, self.step_ema, self.gamma)


def chunk_boundary(sent: int, gamma: int, first: int) -> int:
    """Drafts of an epoch at which its next chunk is due, `sent` drafts being out: the first
    chunk holds `first` (fast verification), later ones end on multiples of gamma."""
    first = min(first, gamma)
    return first if sent < first else (sent // gamma + 1) * gamma


def auto_lookahead(latency: float, step: float, gamma: int) -> int:
    """Drafts held ahead of the verified frontier: a block plus what one draft `step` makes
    during a request's `latency` (RTT + T_verify), between 2 and 8 blocks."""
    blocks = math.ceil(latency / (step * gamma)) + 1
    return min(8, max(2, blocks)) * gamma
