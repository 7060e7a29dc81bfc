"""Greedy scheduling of the aggregator (paper Sec. 5.1) and the wall-time theory (Sec. 6).

Words used here (from the aggregator's point of view: `here` aggregates now, `there` is
the other side):
- *c_dec*: seconds one side needs to produce a draft at its current context length.
- *rtt*: transmission round trip of one aggregation, c_trans_here + c_trans_there (target
  token out, the peer's next draft back).
- *alpha*: moving-average acceptance rate of a side's drafts.
- *Z_s* (Eq. 7): expected latency per token if side s aggregates from now on:
  `Z_s = alpha_o max(c_s, c_o) + (1 - alpha_o) max(c_s, c_o + rtt)`, o the other side.
  A rejected draft of the other side costs a round trip; a rejected local draft does not.
- *pipelined Z'_s* (ours, the default model): `Z'_s = max(c_s, c_o + (1 - alpha_o) rtt)`.
  Eq. 7 charges every rejection of the other side's draft a whole round trip on the token
  clock, as if no side drafted ahead. Both sides do (`lookahead` drafts): a rejected
  non-aggregator loses a round trip of its own drafting (it redrafts from the target once it
  arrives), but the aggregator keeps drafting meanwhile, so the token rate is that of the
  slower of the two draft streams, each side's decode plus its own stalls. Where c_o < c_s <
  c_o + rtt the two disagree (Eq. 7 is the larger): a faster side that does not aggregate
  catches up on its rejections within the lookahead. On replayed traces Eq. 7 moved the
  aggregator onto a 10x faster cloud whose drafts failed more often and lost up to 3.2% to
  fixed placements; the pipelined model stayed within 1.7% (docs/dragon-figures.md, "A
  pipelined latency model").
- *latency gap* (Eq. 8): `Z_here - Z_there` (or `Z'`); the aggregator moves when it is > 0
  (the paper's rule), or, with a *switch horizon* H (ours), when it exceeds rtt / 2 / H: a switch
  costs a one-way trip (the new aggregator waits for the switch message), which Eq. 8 leaves
  out, so the move must repay it within H tokens. Without it, on replayed traces where the
  sides' decode costs differ 2-3x, noise in the acceptance estimates flipped the aggregator
  4-10 times a generation at 300-400 ms and lost 3.5-4.5% to the best fixed placement
  (docs/dragon-figures.md, "Costs that differ 2-3x").
- *mirrored* (ours): under mirroring (machine.py) the side that does not aggregate resolves a
  position as soon as it holds both drafts, so where the aggregator sits moves no token time:
  Eq. 7 is the same for both placements and the true gap is zero. The scheduler then computes
  Eq. 8's gap for the record but keeps the aggregator where it is; moving it would only cost
  a message (at small round trips, noise in the acceptance estimates flipped it a dozen
  times an answer in `tandem demo`).
- *first aggregator* (ours): the paper starts on the device. The cloud picks it instead once
  its decoder is ready (`Scheduler.first`), from both offline decode profiles, the acceptance
  prior (0.5 each) and the RTT measured so far, and its READY carries the pick ahead of its
  first draft, so the pick costs no trip and no horizon price applies. Starting on the device
  cost a switch's one-way trip in every answer where the device is the faster side: 0.2-1.7%
  behind fixed Cloud in the replays, 0.0% with the pick (docs/dragon-figures.md, "The first
  aggregator picked at READY").

Strategies (`Scheduler`): "dragon" (Eq. 7/8), "device", "cloud" (static), "random" (a fair
coin per token from the position seed). All functions here are pure; a simulator (paper
Fig. 8) can drive `Scheduler` with recorded traces.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tandem.protocols.dragon.config import (
    CLOUD,
    DEVICE,
    PIPELINED,
    SCHEDULER_MODELS,
    STRATEGIES,
    peer_of,
)
from tandem.sampling.seeds import position_seed


def expected_latency(
    c_dec_self: float, c_dec_other: float, alpha_other: float, rtt: float
) -> float:
    """Eq. 7: expected seconds per token while `self` aggregates."""
    return alpha_other * max(c_dec_self, c_dec_other) + (1.0 - alpha_other) * max(
        c_dec_self, c_dec_other + rtt
    )


def latency_gap(
    c_dec_l: float, c_dec_r: float, alpha_l: float, alpha_r: float, rtt: float
) -> float:
    """Eq. 8 as Z_l - Z_r (l aggregates now); > 0 means r is the better aggregator."""
    return expected_latency(c_dec_l, c_dec_r, alpha_r, rtt) - expected_latency(
        c_dec_r, c_dec_l, alpha_l, rtt
    )


def latency_gap_piecewise(
    c_dec_l: float, c_dec_r: float, alpha_l: float, alpha_r: float, rtt: float
) -> float:
    """Eq. 8 exactly as printed (j = c_dec_r - c_dec_l); equals `latency_gap`."""
    j = c_dec_r - c_dec_l
    if c_dec_l <= c_dec_r - rtt:
        return (1 - alpha_r) * rtt
    if c_dec_l <= c_dec_r:
        return (1 - alpha_l) * j + (alpha_l - alpha_r) * rtt
    if c_dec_l <= c_dec_r + rtt:
        return (1 - alpha_r) * j + (alpha_l - alpha_r) * rtt
    return (alpha_l - 1) * rtt


def pipelined_latency(
    c_dec_self: float, c_dec_other: float, alpha_other: float, rtt: float
) -> float:
    """Ours: seconds per token while `self` aggregates and both sides draft ahead: the slower
    draft stream, the other side's paying a round trip per rejected draft."""
    return max(c_dec_self, c_dec_other + (1.0 - alpha_other) * rtt)


def pipelined_gap(
    c_dec_l: float, c_dec_r: float, alpha_l: float, alpha_r: float, rtt: float
) -> float:
    """`latency_gap` with `pipelined_latency` for Eq. 7; > 0 means r is the better aggregator."""
    return pipelined_latency(c_dec_l, c_dec_r, alpha_r, rtt) - pipelined_latency(
        c_dec_r, c_dec_l, alpha_l, rtt
    )


def synchronized_latency(c_dec_device: float, c_dec_cloud: float, rtt: float) -> float:
    """Per-token latency of token-wise synchronisation (DRDG/TW), aggregating on the device:
    Eq. 7 with every draft rejected."""
    return max(c_dec_device, c_dec_cloud + rtt)


def predicted_speedup(
    c_dec_device: float, c_dec_cloud: float, alpha_cloud: float, rtt: float
) -> float:
    """Theorem 6.2: S = Z~ / Z for aggregation on the device (l = device, r = cloud).

    The paper's 1 / S forms, multiplied out so that no tiny ratio underflows to a zero
    denominator: 1 - a / (1 + c_r / rtt) = (c_r + (1 - a) rtt) / (c_r + rtt), and
    1 - (1 - c_l / (c_r + rtt)) a = ((1 - a)(c_r + rtt) + a c_l) / (c_r + rtt).
    Infinite when every draft is accepted and the remote side costs nothing."""
    synchronised = c_dec_cloud + rtt
    if c_dec_device <= c_dec_cloud:
        if rtt <= 0:
            return 1.0
        speculative = c_dec_cloud + (1 - alpha_cloud) * rtt
    elif c_dec_device <= synchronised:
        speculative = (1 - alpha_cloud) * synchronised + alpha_cloud * c_dec_device
    else:
        return 1.0
    return synchronised / speculative if speculative > 0 else math.inf


@dataclass(frozen=True)
class Estimates:
    """What the scheduler knows after an aggregation."""

    c_dec: dict[str, float]  # side -> seconds per draft
    alpha: dict[str, float]  # side -> acceptance rate
    rtt: float  # seconds


@dataclass(frozen=True)
class Decision:
    aggregator: str  # side that aggregates the next position
    gap: float  # Z_here - Z_there (Eq. 8, or Z' pipelined), seconds; 0 for non-dragon strategies


class Scheduler:
    """Chooses the side that aggregates the next position."""

    def __init__(
        self,
        strategy: str = "dragon",
        *,
        seed: int = 0,
        margin: float = 0.0,
        horizon: int = 0,
        mirrored: bool = False,
        model: str = PIPELINED,
    ):
        """`margin`: seconds per token the other side must be better by; `horizon`: tokens a
        switch must repay its one-way trip in (0: no such price, the paper's rule);
        `mirrored`: the protocol mirrors, so "dragon" never moves the aggregator; `model`:
        "pipelined" (ours) or "eq7" (the paper's) expected latency per placement."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}")
        if horizon < 0:
            raise ValueError("horizon must be >= 0")
        if model not in SCHEDULER_MODELS:
            raise ValueError(f"unknown scheduler model {model!r}")
        self.strategy = strategy
        self.seed = seed
        self.margin = margin
        self.horizon = horizon
        self.mirrored = mirrored
        self.model = model
        self._gap = pipelined_gap if model == PIPELINED else latency_gap

    @classmethod
    def for_config(cls, config) -> Scheduler:
        """The scheduler a `DragonConfig` describes (strategy, seed, margin, horizon, mirror,
        model)."""
        return cls(config.strategy, seed=config.seed, margin=config.switch_margin_s,
                   horizon=config.switch_horizon, mirrored=config.mirror,
                   model=config.scheduler_model)  # fmt: skip

    def first(self, estimates: Estimates | None) -> str:
        """The side that aggregates position 0 (module docstring, *first aggregator*): the
        cloud for "cloud"; for "dragon", unmirrored, the better placement by this model when
        the device's is worse by more than `margin`; else the device."""
        if self.strategy == CLOUD:
            return CLOUD
        if self.strategy != "dragon" or self.mirrored or estimates is None:
            return DEVICE
        return CLOUD if self._gap_from(DEVICE, estimates) > self.margin else DEVICE

    def _gap_from(self, here: str, estimates: Estimates) -> float:
        """This model's Eq. 8 gap while `here` aggregates; > 0: the other side is better."""
        c, alpha, there = estimates.c_dec, estimates.alpha, peer_of(here)
        return self._gap(c[here], c[there], alpha[here], alpha[there], estimates.rtt)

    def decide(self, here: str, position: int, estimates: Estimates | None) -> Decision:
        if self.strategy in (DEVICE, CLOUD):
            return Decision(self.strategy, 0.0)
        if self.strategy == "random":
            coin = random.Random(position_seed(self.seed, "schedule", position)).random()
            return Decision(DEVICE if coin < 0.5 else CLOUD, 0.0)
        if estimates is None:
            return Decision(here, 0.0)
        there = peer_of(here)
        gap = self._gap_from(here, estimates)
        if self.mirrored:  # no placement is faster: nothing to repay a switch's message
            return Decision(here, gap)
        threshold = self.margin
        if self.horizon:
            threshold = max(threshold, estimates.rtt / 2 / self.horizon)
        return Decision(there if gap > threshold else here, gap)
