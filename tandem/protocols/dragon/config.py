"""DRAGON session settings, shared by both sides, and the seeds derived from them.

Words used here:
- *side*: "device" or "cloud" (`SIDES`); the *peer* of a side is the other one.
- *strategy*: who runs the aggregator. "dragon" = the greedy scheduler of paper Sec. 5
  (Eq. 7/8), "device" / "cloud" = always that side, "random" = a fair coin after every token.
- *position*: index of a generated token (0 = the first new token).
- *position seed*: every random draw of a session is made with a generator seeded from
  (seed, purpose, position), never from a shared stream. Draft t of a side and the
  aggregation of position t therefore do not depend on timing, on rollbacks, or on which
  side aggregates: with the same seed, the output is the same under every strategy and link.

The device chooses the settings and sends them in its start message (`to_json`), so both
sides run with the same ones.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from tandem.errors import TandemError

DEVICE, CLOUD = "device", "cloud"
ROWS = ("documents", "side")
SIDES = (DEVICE, CLOUD)
STRATEGIES = ("dragon", "device", "cloud", "random")
SCORERS = ("embedding", "bm25", "static")
BRANCHES = ("off", "peer", "own")
PIPELINED = "pipelined"
SCHEDULER_MODELS = (PIPELINED, "eq7")  # expected latency per placement: ours, the paper's


def peer_of(side: str) -> str:
    return CLOUD if side == DEVICE else DEVICE


@dataclass(frozen=True, kw_only=True)
class DragonConfig:
    """Everything both sides must agree on for one generation."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy (drafts and target are argmaxes)
    seed: int = 0
    stop_at_eos: bool = True
    docs_per_side: int = 2  # top-k documents each side retrieves from its own corpus
    # "documents": one row per document, mixed by relevance (the paper's per-document
    # aggregation); "side": one row per side holding all its documents (ours: one decode row
    # per side instead of k; the side's weight is still logsumexp of its relevance logits)
    rows: str = "documents"
    codec: str = "top-p"  # tandem.codecs name for the draft distributions (paper: top-p 0.8)
    codec_params: dict[str, float] = field(default_factory=lambda: {"p": 0.8})
    strategy: str = "dragon"
    # most unresolved drafts a side keeps ahead of the target sequence; it must cover a round
    # trip in decode steps or the drafting side stalls waiting for resolutions (8 drafts per
    # round trip at most; docs/dragon.md, "Drafting ahead of a round trip")
    lookahead: int = 32
    # branch drafts (machine.py, "Branch drafts"; the output does not depend on them): a side
    # that does not aggregate also drafts the next position after another token than its own
    # draft, so a rejection there costs the aggregator no round trip; "peer": after the
    # peer's differing draft, "own": after its own second choice where its draft holds < 0.5
    # of its law, "off"; only while the round trip exceeds two of its decodes. Off by
    # default: neither paid on this testbed (docs/dragon.md, "Branch drafts, measured")
    branch: str = "off"
    # the side that does not aggregate runs Algorithm 1 itself on the two drafts it holds
    # (same laws, same position seed) instead of waiting a one-way trip for the verdict,
    # which then only confirms (machine.py, "Mirroring"; the output does not depend on it;
    # docs/dragon.md, "Mirroring, measured": -13% per token at +300 ms, nothing at +0)
    mirror: bool = True
    scorer: str = "embedding"  # dynamic relevance: embedding | bm25 | static (retrieval scores)
    relevance_interval: int = 4  # re-score the documents every this many tokens
    relevance_temperature: float = 0.1  # relevance logits = similarity / temperature
    relevance_prefetch: bool = True  # score a prefix on a thread while its last token decodes
    # weight of a new observation in the acceptance moving average (0.3 until 2026-11-27:
    # noisier estimates flipped the aggregator on noise, docs/dragon-figures.md)
    acceptance_ema: float = 0.05
    slope_weight: float = 0.1  # rho: weight of a new decode timing in the online slope update
    rtt_probe_s: float = 0.5  # in-band Ping interval while generating (0 = no probes)
    bandwidth_probe_bytes: int = 16_384  # one padding burst at start to estimate the uplink
    switch_margin_s: float = 0.0  # switch only when the other side is better by this much
    # a switch must repay its one-way trip within this many tokens (scheduler.py; 0: the
    # paper's rule, which prices no switch)
    switch_horizon: int = 64
    # the scheduler's expected latency per placement: "pipelined" (ours: the slower draft
    # stream, both sides drafting ahead) or "eq7" (the paper's, every rejection of the other
    # side's draft a round trip on the token clock); scheduler.py
    scheduler_model: str = PIPELINED
    timeline: bool = False  # the cloud sends its per-token timeline to the device at the end

    def __post_init__(self) -> None:
        checks = [
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.docs_per_side >= 0, "docs_per_side must be >= 0"),
            (self.rows in ROWS, f"rows must be one of {', '.join(ROWS)}"),
            (self.strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}"),
            (self.scorer in SCORERS, f"scorer must be one of {', '.join(SCORERS)}"),
            (self.lookahead >= 1, "lookahead must be >= 1"),
            (self.branch in BRANCHES, f"branch must be one of {', '.join(BRANCHES)}"),
            (self.relevance_interval >= 1, "relevance_interval must be >= 1"),
            (self.relevance_temperature > 0, "relevance_temperature must be > 0"),
            (0 < self.acceptance_ema <= 1, "acceptance_ema must be in (0, 1]"),
            (self.switch_horizon >= 0, "switch_horizon must be >= 0"),
            (
                self.scheduler_model in SCHEDULER_MODELS,
                f"scheduler_model must be one of {', '.join(SCHEDULER_MODELS)}",
            ),
            (0 < self.slope_weight <= 1, "slope_weight must be in (0, 1]"),
            (self.rtt_probe_s >= 0, "rtt_probe_s must be >= 0"),
            (self.bandwidth_probe_bytes >= 0, "bandwidth_probe_bytes must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise TandemError(f"dragon: {message}")
        object.__setattr__(self, "codec_params", dict(self.codec_params))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def first_aggregator(self) -> str:
        return CLOUD if self.strategy == CLOUD else DEVICE

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> DragonConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise TandemError(f"dragon: unknown settings {', '.join(sorted(unknown))}")
        return cls(**data)

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()
