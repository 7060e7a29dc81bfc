"""Device-only generation: one model, no network. The reference every collaborative mode is
compared with (and, at temperature 0, must equal token for token).

Words: *prompt ids* are what the model is conditioned on; *new tokens* are what it generates;
`on_token(token_id)` is called for each new token as soon as it exists (streaming; see
`tandem.protocols.decoding.text_stream` for text pieces).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.config import SamplingConfig
from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken, decode_steps
from tandem.protocols.report import Headline


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str
    prefill_s: float  # time to first token (prefill + first sampling)
    decode_s: float  # time for the remaining tokens
    finish_reason: str  # "length" | "eos"
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput (tokens after the first, over the time after the first)."""
        return self.headline().tokens_per_s

    def headline(self) -> Headline:
        ttft = self.prefill_s if self.tokens else None
        decode = max(0, len(self.tokens) - 1)
        return Headline(
            mode="local",
            tokens=len(self.tokens),
            ttft_s=ttft,
            decode_tokens=decode,
            decode_s=self.decode_s if decode else 0.0,
            finish_reason=self.finish_reason,
        )


def generate(
    lm: CausalLM,
    prompt_ids: list[int],
    config: SamplingConfig,
    on_token: OnToken | None = None,
) -> GenerationResult:
    """Autoregressive decoding with the KV cache; streams through `on_token`."""
    eos = lm.tokenizer.eos_token_id if config.stop_at_eos else None
    start = time.perf_counter()
    state = lm.prefill(prompt_ids)
    tokens: list[int] = []
    first_at = start
    steps = decode_steps(
        lm,
        state,
        seed=config.seed,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        eos=eos,
    )
    for token in steps:
        tokens.append(token)
        if len(tokens) == 1:
            first_at = time.perf_counter()
        if on_token is not None:
            on_token(token)
    finish = "eos" if tokens and tokens[-1] == eos else "length"
    end = time.perf_counter()
    return GenerationResult(
        tokens=tokens,
        text=lm.tokenizer.decode(tokens),
        prefill_s=first_at - start,
        decode_s=end - first_at,
        finish_reason=finish,
    )
