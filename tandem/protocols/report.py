"""One `Report`: the numbers every mode's result gives under the same names.

Each mode keeps its own result type for what only it measures (a speculative run's verdicts,
DRAGON's resolutions, RAPID's rounds, a baseline's transfer); every one of them also answers
`headline()` with the same `Headline`, so the CLI, the API and a user comparing modes read
one shape: tokens, time to first token, decode time and throughput, finish reason, bytes.

    mode / result type                      headline().mode
    local generation (local.GenerationResult)   "local"
    spec, ar, private-spec, device-only (spec.stats.SpecReport)   its mode
    DRAGON (dragon.report.SideReport)            "dragon"
    DRAGON baselines (baselines.dragon.BaselineReport)   the method
    RAPID and its LC / RAG baselines (rapid.engine.RapidResult)   "rapid"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Headline:
    mode: str
    tokens: int  # new tokens
    ttft_s: float | None  # first new token known, from the start (None: not measured)
    decode_tokens: int  # tokens the decode time covers (after the first, where TTFT is known)
    decode_s: float
    finish_reason: str  # "length" | "eos" | "aborted" | ...; "" where the mode does not record it
    uplink_bytes: int = 0  # device -> cloud, on the wire (0: no network)
    downlink_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: `decode_tokens / decode_s` (0 when nothing was timed)."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def to_json(self) -> dict:
        return {**self.__dict__, "tokens_per_s": self.tokens_per_s}


@runtime_checkable
class Report(Protocol):
    tokens: list[int]
    text: str

    def headline(self) -> Headline: ...


def from_times(
    mode: str, tokens: list[int], token_times: list[float], finish_reason: str, **bytes_
) -> Headline:
    """The headline of a run that timed each token (seconds from its start)."""
    ttft = token_times[0] if token_times else None
    decode = token_times[-1] - token_times[0] if len(token_times) > 1 else 0.0
    return Headline(
        mode=mode,
        tokens=len(tokens),
        ttft_s=ttft,
        decode_tokens=max(0, len(token_times) - 1),
        decode_s=decode,
        finish_reason=finish_reason,
        **bytes_,
    )


def finish_of(tokens: list[int], eos_id: int | None) -> str:
    """`"eos"` when the output ends with the end-of-sequence token, else `"length"`."""
    if tokens and eos_id is not None and tokens[-1] == eos_id:
        return "eos"
    return "length"
