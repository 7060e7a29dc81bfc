"""Which exact method, and which draft length, is fastest in a regime: a pure cost model and
the adaptive controller built on it (no I/O, no clocks: callers feed it measurements).

Words used here (as in theory.py): alpha = per-token acceptance probability, gamma = draft
tokens per block, t_draft = one draft step (s per token), t_decode(n) = base + per_token * n =
one target forward pass over n new tokens (t_ar = t_decode(1) is one autoregressive step,
t_decode(gamma) verifies a block), rtt = round trip (s). Throughputs are steady-state decode
rates in tokens/s (TTFT excluded). EL = (1 - alpha^gamma) / (1 - alpha) (Eq. 5), h = alpha^gamma.

    ar      R = 1 / t_ar                                              (cloud AR streaming)
    sync    R = EL_bonus / (gamma t_draft + rtt + t_decode(gamma + 1))           (Eq. 6-7)
    async   R = EL / [h max(T_d, rtt + t_v) + (1 - h)(T_d + rtt + t_v)]            (Eq. 9)
            with T_d = gamma t_draft, t_v = t_decode(gamma)
    eager   the extension of Eq. 9 to "the cloud never idles" (eager.py). A rejection
            opens a gap in which the cloud decodes on its own (AR) while the verdict goes
            down and the device drafts a new chain from the residual; speculation resumes
            when a chunk of that chain reaches past the cloud's frontier. A chunk of k drafts
            arrives at rtt + k t_draft, when the cloud has decoded about that / t_ar tokens,
            so the chain catches up once k t_draft + rtt <= (k - 1) t_ar:
            k     = (rtt + t_ar) / (t_ar - t_draft), rounded up to the chunks actually sent
                    (c = first_chunk, then multiples of gamma); no catching up when
                    t_draft >= t_ar (then R = 1 / t_ar: eager is cloud AR)
            G     = rtt + k t_draft        the gap
            n     = G / t_ar               positions the cloud commits alone in it; the new
                                           chain's drafts there must all match them
            T_rec = G / alpha^n            gaps until one chain survives (geometric)
            E[T]  = h max(T_d, t_v) + (1 - h)(t_v + T_rec)
            E[N]  = EL + (1 - h) T_rec / t_ar
            R     = E[N] / E[T]
            Between rejections blocks stream (enough lookahead: the RTT is hidden, the slower
            side sets the pace); a rejection costs T_rec, during which the cloud still
            produces tokens at its AR rate instead of idling. alpha -> 0 gives R -> 1 / t_ar
            (cloud AR), alpha -> 1 gives R -> gamma / max(T_d, t_v).

These closed forms are what the controller plans with (cheap enough for every round). Our
pipelines do more than they price (blocks in flight, a short first chunk, merged passes):
epochs.py prices their own rules, the prediction the benchmarks compare with measurements.

Device-only decoding is not exact (the draft model's law), so it is never a choice here.
The controller (`Controller`) keeps running estimates of alpha, t_draft, t_decode's line and
rtt, and `plan()` returns the method and draft length of highest predicted throughput. Eager's
branches have no closed form: the controller also learns how the draft's unsure positions fare
(`Branching`) and `branches_pay` asks the epoch model (epochs.branch_gain) whether they pay.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

EXACT_METHODS = ("ar", "sync", "async", "eager")
GAMMAS = tuple(range(1, 9))
MIN_POWER = 1e-12  # floor of alpha^n in T_rec (alpha -> 0: the recovery never ends)
MARGIN = 0.01  # a method listed later must predict this much more to be chosen


@dataclass(frozen=True)
class Costs:
    """One regime's timings (seconds)."""

    t_draft: float  # one draft step
    decode_base: float  # t_decode(n) = decode_base + decode_per_token * n
    decode_per_token: float
    rtt: float
    first_chunk: int = 1  # drafts in the first request of a chain (fast verification)

    def t_decode(self, n: int) -> float:
        return self.decode_base + self.decode_per_token * n

    @property
    def t_ar(self) -> float:
        return self.t_decode(1)

    @classmethod
    def from_points(
        cls, *, t_draft: float, t_ar: float, t_block: float, block: int, rtt: float, **kw
    ) -> Costs:
        """The line through t_decode(1) = t_ar and t_decode(block) = t_block."""
        per_token = (t_block - t_ar) / (block - 1) if block > 1 else 0.0
        return cls(
            t_draft=t_draft,
            decode_base=t_ar - per_token,
            decode_per_token=per_token,
            rtt=rtt,
            **kw,
        )


# What a controller assumes before it has measured anything (seconds): a guess under which
# its first plan speculates (a draft step half the target's AR step, a block nearly as cheap
# to verify as one token, as on a GPU), so a first eager generation measures every cost; each
# figure gives way to the first measurement of it (Controller._avg). With it, set
# `measure_first`: a target AR step measured before any draft step (a fast cloud) must not
# meet the assumed draft step and stop the drafting that would measure it.
UNMEASURED = Costs(t_draft=0.03, decode_base=0.05, decode_per_token=0.01, rtt=0.05)


def preempt_threshold(t_ar: float, per_token: float, alpha: float, drafts: int) -> float:
    """How long into an AR step a request with `drafts` drafts from the step's position may
    arrive and still stop it with profit. Stopping loses the time run and verifies the step's
    position with the drafts in one pass (t_ar + per_token * drafts); finishing commits that
    position first, then verifies the rest. If the draft there matches (probability alpha),
    stopping at `elapsed` commits everything t_ar - per_token - elapsed sooner; if it does
    not, finishing commits that position elapsed + per_token * drafts sooner, and with it the
    news that ends the chain. Stop iff alpha (t_ar - per_token - elapsed) > (1 - alpha)
    (elapsed + per_token * drafts). alpha = 1 gives the old rule, elapsed < t_ar - per_token."""
    return alpha * (t_ar - per_token) - (1.0 - alpha) * per_token * drafts


def expected_length(alpha: float, gamma: int, *, bonus: bool = False) -> float:
    """Eq. 5 (one more power of alpha with a bonus token)."""
    terms = gamma + 1 if bonus else gamma
    return float(terms) if alpha >= 1.0 else (1.0 - alpha**terms) / (1.0 - alpha)


def throughput(method: str, alpha: float, gamma: int, costs: Costs) -> float:
    """Predicted decode rate (tokens/s) of `method` (module docstring)."""
    c = costs
    t_blk = gamma * c.t_draft
    if method == "ar":
        return 1.0 / c.t_ar
    if method == "sync":
        step = t_blk + c.rtt + c.t_decode(gamma + 1)
        return expected_length(alpha, gamma, bonus=True) / step
    hit, t_v = alpha**gamma, c.t_decode(gamma)
    if method == "async":
        step = hit * max(t_blk, c.rtt + t_v) + (1.0 - hit) * (t_blk + c.rtt + t_v)
        return expected_length(alpha, gamma) / step
    if method == "eager":
        if c.t_draft >= c.t_ar:
            return 1.0 / c.t_ar  # drafts never get ahead of the cloud's own decoding
        gap = c.rtt + catch_up_drafts(gamma, c) * c.t_draft
        recovery = gap / max(MIN_POWER, alpha ** (gap / c.t_ar))
        time = hit * max(t_blk, t_v) + (1.0 - hit) * (t_v + recovery)
        tokens = expected_length(alpha, gamma) + (1.0 - hit) * recovery / c.t_ar
        return tokens / time
    raise ValueError(f"unknown method {method!r}")


def catch_up_drafts(gamma: int, costs: Costs) -> int:
    """Drafts of a new chain sent when its chunk first reaches past the cloud's frontier
    (module docstring, eager's k): first_chunk, then multiples of gamma."""
    c = costs
    need = (c.rtt + c.t_ar) / (c.t_ar - c.t_draft)
    if need <= c.first_chunk:
        return c.first_chunk
    return gamma * math.ceil(need / gamma)


@dataclass(frozen=True)
class Branching:
    """What eager's branches depend on in a regime (eager.py: *branch*), per draft position;
    priced by epochs.branch_rate."""

    unsure_match: float  # P(the draft model's top probability < branch_below | its draft matches)
    unsure_miss: float  # the same where its draft does not match the target's token
    second: float  # P(the target's token is the draft's second choice | no match, unsure)
    length: int = 4  # branch_len
    refeed_s: float = 0.0  # the first draft step after a taken branch feeds it: extra seconds


BRANCHING_PRIOR = Branching(unsure_match=0.05, unsure_miss=0.5, second=0.3)


@dataclass(frozen=True)
class Plan:
    method: str
    gamma: int  # 0 for "ar"
    predicted_tok_s: float
    table: dict[str, dict[int, float]]  # method -> gamma -> predicted tok/s


def best(
    alpha: float,
    costs: Costs,
    methods: tuple[str, ...] = EXACT_METHODS,
    gammas: tuple[int, ...] = GAMMAS,
) -> Plan:
    """The method and draft length of highest predicted throughput; a later method or a
    longer block must beat the current choice by MARGIN (ties go to the simpler one)."""
    table: dict[str, dict[int, float]] = {}
    choice = ("", 0, -1.0)
    for method in methods:
        lengths = (0,) if method == "ar" else gammas
        table[method] = {g: throughput(method, alpha, max(1, g), costs) for g in lengths}
        for g, rate in table[method].items():
            if rate > choice[2] * (1 + MARGIN):
                choice = (method, g, rate)
    return Plan(method=choice[0], gamma=choice[1], predicted_tok_s=choice[2], table=table)


@dataclass
class Controller:
    """Running estimates, and the plan they give. Feed it what one side measures; call `plan()`
    once per round. Estimates start from `prior` and move by exponential averaging (`weight`
    of each new observation); alpha is a ratio of decayed counts."""

    prior: Costs
    alpha: float = 0.8
    methods: tuple[str, ...] = EXACT_METHODS
    gammas: tuple[int, ...] = GAMMAS
    weight: float = 0.2
    _t_draft: float | None = None
    _rtt: float | None = None
    _t_ar: float | None = None
    _per_token: list[float] = field(default_factory=list)  # (t_decode(n) - t_ar) / (n - 1)
    _agree: float = 0.0
    _disagree: float = 0.0
    branching_prior: Branching = BRANCHING_PRIOR
    # decayed counts: drafts that matched, of them unsure; that did not, of them unsure; of
    # those, the target's token the draft's second choice (eager.py: *branch*)
    _confidence: list[float] = field(default_factory=lambda: [0.0] * 5)
    _branch_plans: dict[tuple, tuple[bool, float]] = field(default_factory=dict)
    branch_choice: bool = True  # the last answer of `branches_pay_at` (before any: branch)
    exploring: bool = False  # plan() leaves cloud AR out (the caller measures speculation)
    # plan() also leaves it out until a draft step is measured: for a prior that is a guess
    # (UNMEASURED), so that no plan rests on an assumed draft cost
    measure_first: bool = False

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.weight) * old + self.weight * new

    def observe_draft(self, seconds: float) -> None:
        self._t_draft = self._avg(self._t_draft, seconds)

    def observe_ar(self, seconds: float) -> None:
        self._t_ar = self._avg(self._t_ar, seconds)

    def observe_verify(self, drafts: int, seconds: float) -> None:
        """One forward pass over `drafts` tokens took `seconds`."""
        if drafts <= 1:
            self.observe_ar(seconds)
            return
        t_ar = self._t_ar if self._t_ar is not None else self.prior.t_ar
        self._per_token.append(max(0.0, (seconds - t_ar) / (drafts - 1)))
        del self._per_token[:-16]

    def observe_network(self, seconds: float) -> None:
        self._rtt = self._avg(self._rtt, seconds)

    def observe_drafts(self, agreed: int, disagreed: int) -> None:
        """Drafts that matched the committed token, and mismatches (at most one per chain)."""
        decay = 1 - self.weight / 8
        self._agree = decay * self._agree + agreed
        self._disagree = decay * self._disagree + disagreed

    @property
    def alpha_estimate(self) -> float:
        seen = self._agree + self._disagree
        prior_weight = 4.0  # pseudo-observations of the prior alpha
        return (self._agree + prior_weight * self.alpha) / (seen + prior_weight)

    def costs(self) -> Costs:
        p = self.prior
        t_ar = self._t_ar if self._t_ar is not None else p.t_ar
        per_token = (
            sum(self._per_token) / len(self._per_token) if self._per_token else p.decode_per_token
        )
        return Costs(
            t_draft=self._t_draft if self._t_draft is not None else p.t_draft,
            decode_base=t_ar - per_token,
            decode_per_token=per_token,
            rtt=self._rtt if self._rtt is not None else p.rtt,
            first_chunk=p.first_chunk,
        )

    def observe_confidence(
        self, match: int, unsure_match: int, miss: int, unsure_miss: int, second: int
    ) -> None:
        """One generation's drafts as branches see them (eager.py: `EagerDrafter.confidence`):
        older generations' counts weigh 0.8 each time."""
        new = (match, unsure_match, miss, unsure_miss, second)
        self._confidence = [0.8 * old + n for old, n in zip(self._confidence, new, strict=True)]

    def branching(self, length: int, refeed_s: float = 0.0) -> Branching:
        """The running estimate, each rate with 4 pseudo-observations of the prior's."""
        match, unsure_match, miss, unsure_miss, second = self._confidence
        prior, weight = self.branching_prior, 4.0
        return Branching(
            unsure_match=(unsure_match + weight * prior.unsure_match) / (match + weight),
            unsure_miss=(unsure_miss + weight * prior.unsure_miss) / (miss + weight),
            second=(second + weight * prior.second) / (unsure_miss + weight),
            length=length,
            refeed_s=refeed_s,
        )

    def branches_pay(self, gamma: int, length: int, refeed_s: float = 0.0) -> tuple[bool, float]:
        """Whether eager runs faster with branches at the running estimates, and the gain
        (`branches_pay_at`)."""
        return self.branches_pay_at(
            self.alpha_estimate, gamma, self.costs(), self.branching(length, refeed_s)
        )

    def branches_pay_at(
        self, alpha: float, gamma: int, costs: Costs, branching: Branching
    ) -> tuple[bool, float]:
        """Whether eager runs faster with branches, by the epoch model (epochs.branch_gain: a
        gain above 1 + 2 MARGIN says yes), and the gain; remembered per rounded input (one
        pricing costs 0.1-0.3 s of CPU: the device runs it in a thread beside its generation).
        Sets `branch_choice`, the answer callers start the next generation with."""
        from tandem.protocols.spec import epochs  # epochs builds on this module

        b = branching
        key = (
            gamma, b.length, round(b.refeed_s, 3), round(20 * alpha),
            *(round(20 * x) for x in (b.unsure_match, b.unsure_miss, b.second)),
            *(round(10 * math.log(max(x, 1e-6))) for x in (costs.t_draft, costs.t_ar)),
            round(costs.decode_per_token, 3), round(costs.rtt, 2),
        )  # fmt: skip
        if key not in self._branch_plans:
            gain = epochs.branch_gain(alpha, gamma, costs, b)
            self._branch_plans[key] = (gain > 1 + 2 * MARGIN, gain)
        self.branch_choice = self._branch_plans[key][0]
        return self._branch_plans[key]

    def plan(self, methods: tuple[str, ...] | None = None) -> Plan:
        """The best plan at the running estimates; while `exploring` (and, with
        `measure_first`, until a draft step is measured), among the speculative methods only."""
        methods = methods or self.methods
        if self.exploring or (self.measure_first and self._t_draft is None):
            methods = tuple(m for m in methods if m != "ar") or methods
        return best(self.alpha_estimate, self.costs(), methods, self.gammas)


@dataclass
class Generations:
    """Adaptive eager across generations (the device's side, sans I/O): before each one, how it
    runs. "ar": the controller's plan is cloud AR, so the generation is the cloud's plain AR
    stream (no draft-model prefill, no eager loop: the target's law as before, ~3% faster per
    token and ~4% sooner at the first, measured on HumanEval), whose time per token then feeds
    the controller's t_ar (`measured_ar`). "eager": the eager pipeline with the controller
    (gamma, or no drafting, re-planned every round). An AR stream measures only t_ar, so with
    `explore_every` > 0 the `explore_every`-th generation in a row planned as AR runs
    "explore": eager with the controller `exploring` (drafting every round, `running`), which
    measures the draft step, passes, RTT and alpha again; 0 never explores (a benchmark that
    compares the controller with fixed methods)."""

    controller: Controller
    explore_every: int = 0
    streak: int = 0  # generations in a row planned as AR

    def plan(self) -> str:
        if self.controller.plan(("ar", "eager")).method != "ar":
            self.streak = 0
            return "eager"
        self.streak += 1
        if self.explore_every and self.streak >= self.explore_every:
            self.streak = 0
            return "explore"
        return "ar"

    def not_served(self) -> str:
        """A generation planned as AR whose cloud does not serve the AR stream (it streams AR
        only inside the eager pipeline): it runs eager."""
        self.streak = 0
        return "eager"

    def measured_ar(self, tpot_ms: float | None) -> None:
        """An AR stream's time per output token (its report's `tpot_ms`; None: one token)."""
        if tpot_ms:
            self.controller.observe_ar(tpot_ms / 1e3)

    @contextlib.contextmanager
    def running(self, plan: str) -> Iterator[Controller]:
        """The controller for an eager generation of `plan`, `exploring` for "explore" only and
        for that generation only."""
        self.controller.exploring = plan == "explore"
        try:
            yield self.controller
        finally:
            self.controller.exploring = False
