"""Settings of one edge-cloud speculative decoding session, shared by both sides.

Words used here:
- *pipeline*: "sync" = stop-and-wait (draft a block, send it, wait for the verdict),
  "async" = PicoSpec's pipeline (keep drafting while earlier blocks are verified), or
  "eager" = "the cloud never idles": the async pipeline, and while no draft is waiting the
  cloud decodes on its own and streams those tokens down (eager.py). Eager needs the whole
  sent draft law at the cloud and a stateless uplink codec: not separate, not c-sqs, eta 0.
- *codec*: how draft distributions go up. A `tandem.codecs` name ("dense", "k-sqs", "c-sqs",
  "top-k", "top-p", "identity"), or "separate" = PicoSpec's separate rejection sampling: only
  the draft tokens and their draft probabilities go up; on a rejection the cloud sends the
  top-`downlink_k` of its distribution and the device resamples (approximate, see separate.py).
- *block*: the `draft_len` (gamma) tokens the device drafts before sending; a *chunk* is what
  one VerifyRequest carries (a block, or part of one under fast verification / truncation).
- *position*: index of a generated token (0 = the first new token).
- *eta*: RAPID's knowledge-transfer strength (Eq. 6), used by the private-RAG mode: the cloud
  verifies against the augmented target p_hat = softmax(log p + eta (q - p)) (tail rule `tail`),
  q being the transmitted draft law at that position. eta = 0: plain speculative decoding of
  the target. With eta > 0 and temperature 0 the law is the one-hot argmax of p_hat computed at
  temperature 1 ("augmented greedy"; the drafter then sends its temperature-1 law and drafts
  its argmax). With eta > 0 no bonus token is drawn (the bonus position has no draft law): the
  next block's first draft covers that position, so every position's law is p_hat.
- *verify_calls*: how the cloud feeds a block to its target: "block" = one forward pass (the
  point of speculative decoding: a pass over n tokens costs much less than n passes), "token"
  = one pass per token (context.py, *token calls*). At temperature 0 the output then equals
  the cloud's AR output bit for bit on llama.cpp too, where block passes differ from single
  steps by up to ~1 logit and near-ties can go the other way; it costs what the block saves.
- *branch* (eager only, `branch_below` > 0): where the draft model's own law (softmax of its
  row at temperature 1) puts less than `branch_below` on its top token, the device also drafts
  `branch_len` tokens after the most likely token other than its draft there and sends them
  as a conditional chain; if the cloud commits that token at that position, both sides take
  the branch as the next chain, already at the cloud (eager.py, *branch*). 0 = off.
- *position generator*: every random draw is made with a generator seeded from
  (seed, purpose, position), so the output does not depend on timing, chunking or the link.

The device chooses the settings and sends them in its start message, so both sides agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from tandem.errors import TandemError
from tandem.sampling.rapid import TAIL_RULES

PIPELINES = ("sync", "async", "eager")
VERIFY_CALLS = ("block", "token")
SEPARATE = "separate"
CODECS = ("dense", SEPARATE, "k-sqs", "c-sqs", "top-k", "top-p", "identity")
# The uplink of the device's CLI and API unless told otherwise: K-SQS K=3, 64 bits per draft
# token (dense fp16 sends the whole 151,936-entry law: ~430 KB a token on the real pair, and
# 24-27 ms more per token there even on loopback; docs/spec.md "Using it"). SpecConfig's own
# default stays dense, the reference the law tests start from.
DEVICE_CODEC = ("k-sqs", {"k": 3, "ell": 100})
# Uplink codecs the eager pipeline cannot carry (it needs the whole sent draft law at the cloud
# and no codec state across chains).
NOT_EAGER_CODECS = (SEPARATE, "c-sqs")


def device_codec(codec: str | None, params: dict) -> tuple[str, dict]:
    """(codec, params) the device runs: `DEVICE_CODEC` where no codec is named (its params
    updated by `params`), else the named codec with `params`."""
    if codec is None:
        name, defaults = DEVICE_CODEC
        return name, {**defaults, **params}
    return codec, dict(params)


@dataclass(frozen=True, kw_only=True)
class SpecConfig:
    """Everything both sides must agree on for one speculative generation."""

    pipeline: str = "sync"
    codec: str = "dense"
    codec_params: dict[str, float] = field(default_factory=dict)
    draft_len: int = 4  # gamma: tokens per block (PicoSpec default 4)
    bit_budget: int | None = None  # SQS-SD B: most payload bits per block (None: no budget)
    downlink_k: int = 10  # separate: target top-K sent down on a rejection (PicoSpec: 10)
    fast_verify: bool = True  # async: the first chunk of each epoch is sent at once
    first_chunk: int = 1  # async + fast_verify: tokens in that first ("pre-verify") chunk
    lookahead_blocks: int = 0  # async: most blocks drafted ahead of the verified frontier
    # (0 = auto: enough blocks to keep drafting through one request's round trip, >= 2)
    truncate_factor: float = 2.0  # async: send a partial block once drafting it took this
    # many times its expected time (latency-aware truncation; 0 = off)
    temperature: float = 0.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    max_new_tokens: int = 64
    stop_at_eos: bool = True
    eta: float = 0.0  # RAPID-augmented verification strength (0 = exact target law)
    tail: str = "paper"  # tail rule of RAPID's Eq. 9 (tandem.sampling.rapid)
    tail_ratio: float = 0.1
    verify_calls: str = "block"  # "token": the cloud feeds a block one token per pass
    branch_below: float = 0.0  # eager: draft a branch where the draft's top prob is below this
    branch_len: int = 4  # eager: drafts in a branch

    def __post_init__(self) -> None:
        checks = [
            (self.pipeline in PIPELINES, f"pipeline must be one of {', '.join(PIPELINES)}"),
            (self.codec in CODECS, f"codec must be one of {', '.join(CODECS)}"),
            (self.draft_len >= 1, "draft_len must be >= 1"),
            (self.bit_budget is None or self.bit_budget >= 1, "bit_budget must be >= 1"),
            (self.downlink_k >= 1, "downlink_k must be >= 1"),
            (1 <= self.first_chunk <= self.draft_len, "first_chunk must be in 1..draft_len"),
            (self.lookahead_blocks >= 0, "lookahead_blocks must be >= 0 (0 = auto)"),
            (self.truncate_factor >= 0, "truncate_factor must be >= 0"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k is None or self.top_k >= 1, "top_k must be >= 1"),
            (self.top_p is None or 0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.eta >= 0, "eta must be >= 0"),
            (self.tail in TAIL_RULES, f"tail must be one of {', '.join(TAIL_RULES)}"),
            (0 <= self.tail_ratio <= 1, "tail_ratio must be in [0, 1]"),
            (
                self.verify_calls in VERIFY_CALLS,
                f"verify_calls must be one of {', '.join(VERIFY_CALLS)}",
            ),
            (
                not (self.eta > 0 and self.codec == SEPARATE),
                "eta > 0 needs the whole draft law at the cloud; use an uplink codec "
                "(k-sqs, c-sqs, dense, top-k...), not separate",
            ),
            (
                self.pipeline != "eager" or self.codec not in NOT_EAGER_CODECS,
                "pipeline eager needs a stateless uplink codec (dense, k-sqs, top-k, ...), "
                "not separate or c-sqs",
            ),
            (self.pipeline != "eager" or self.eta == 0, "pipeline eager needs eta = 0"),
            (0 <= self.branch_below <= 1, "branch_below must be in [0, 1] (0 = no branches)"),
            (self.branch_len >= 1, "branch_len must be >= 1"),
            (
                self.branch_below == 0 or self.pipeline == "eager",
                "branch_below > 0 needs pipeline eager (a branch becomes the cloud's next chain)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise TandemError(f"spec: {message}")
        object.__setattr__(self, "codec_params", dict(self.codec_params))

    @property
    def separate(self) -> bool:
        return self.codec == SEPARATE

    @property
    def lookahead(self) -> int:
        """Most unverified drafts the device holds at first (sync: one block; async auto: two
        blocks until the device has measured a round trip)."""
        if self.pipeline == "sync":
            return self.draft_len
        return (self.lookahead_blocks or 2) * self.draft_len

    @property
    def augmented(self) -> bool:
        """Verification against RAPID's augmented target (eta > 0)."""
        return self.eta > 0

    @property
    def augmented_greedy(self) -> bool:
        """eta > 0 at temperature 0: the law is the argmax of p_hat at temperature 1."""
        return self.augmented and self.temperature == 0

    def sampling(self) -> dict:
        """Keyword arguments of `tandem.sampling.warp.warp`."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def law_sampling(self) -> dict:
        """The warp of the laws drafter and verifier compare: `sampling()`, at temperature 1
        under augmented greedy (p_hat needs soft laws; the argmax is taken after)."""
        return {**self.sampling(), "temperature": 1.0} if self.augmented_greedy else self.sampling()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> SpecConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise TandemError(f"spec: unknown settings {', '.join(sorted(unknown))}")
        return cls(**data)
