"""The baselines RAPID is compared with (paper Sec. 3.2), on the same prompts and seeds.

- *LC*: the target decodes alone on the long context C.
- *RAG*: the target decodes alone on the retrieval context C^S (the drafter's prompt).
- *SD*: naive speculative decoding: the same RAG drafter, verified against the target's own
  law p (no knowledge transfer).
- *StreamingLLM drafter* (MagicDec): the drafter reads the whole long prompt, then keeps only
  `sink` first positions and the `window` most recent ones of its KV cache (paper: 4 sink
  tokens, a 4096-token cache); verification as in SD.

StreamingLLM cache: the kept recent keys are rotated back by the number of dropped positions
(RoPE rotations compose, R(a) R(b) = R(a + b)), so the cache holds positions 0..sink+window-1
and new tokens continue contiguously, as in StreamingLLM's position re-assignment. The cache
is compressed again before a round once it outgrows sink + window + `slack` positions.
This needs the transformers backend (a Qwen2-style rotary embedding and a DynamicCache).
"""

from __future__ import annotations

from tandem.errors import TandemError
from tandem.models.base import CausalLM, State
from tandem.protocols.rapid.config import RapidConfig
from tandem.protocols.rapid.drafter import ModelDrafter
from tandem.protocols.rapid.engine import RapidResult, check_pair, generate, make_target, rapid
from tandem.protocols.rapid.states import Prefilled
from tandem.sampling.acceptance import Standard


def lc(target: Prefilled, config: RapidConfig) -> RapidResult:
    """LC: the target alone on its long-context prompt (RAG: the same on a C^S prompt)."""
    result = generate(make_target(target.lm, target.fresh(), config, Standard()), None, config)
    result.prefill_s = target.prefill_s
    return result


rag = lc  # RAG is LC run on the retrieval-context prompt: rag(Prefilled(target_lm, C^S prompt))


def sd(target: Prefilled, drafter: Prefilled, config: RapidConfig) -> RapidResult:
    """Naive SD: the RAG drafter, verified against the target's own law p."""
    return rapid(target, drafter, config, plain=True)


# -- StreamingLLM-style drafter --------------------------------------------------------------


def compress_cache(lm: CausalLM, state: State, *, sink: int, window: int) -> int:
    """Keep the first `sink` and last `window` positions of a one-row state, in place.

    Returns the number of positions dropped (0 if the state already fits).
    """
    if state.batch != 1 or state.pads[0] != 0:
        raise TandemError("the StreamingLLM drafter works on one unpadded row")
    dropped = state.seq_len - sink - window
    if dropped <= 0:
        return 0
    lm.evict(state, sink, sink + dropped)  # the engine drops, shifts and re-rotates its keys
    return dropped


class StreamingDrafter(ModelDrafter):
    """A drafter whose KV cache keeps `sink` + `window` positions (StreamingLLM / MagicDec)."""

    def __init__(
        self, lm: CausalLM, state: State, *, sink: int, window: int, slack: int = 64, **kw
    ):
        super().__init__(lm, state, **kw)
        self.sink, self.window, self.slack = sink, window, slack
        self.dropped = compress_cache(lm, state, sink=sink, window=window)

    def before_round(self) -> None:
        if self.state.seq_len > self.sink + self.window + self.slack:
            self.dropped += compress_cache(self.lm, self.state, sink=self.sink, window=self.window)


def streaming_sd(
    target: Prefilled,
    drafter_lm: CausalLM,
    drafter_state: State,
    config: RapidConfig,
    *,
    sink: int = 4,
    window: int = 1024,
) -> RapidResult:
    """MagicDec-style SD: a StreamingLLM drafter holding the long prompt (`drafter_state`, a
    state of its own that gets compressed), verified against the target's own law."""
    check_pair(target.lm, drafter_lm)
    drafter = StreamingDrafter(
        drafter_lm,
        drafter_state,
        sink=sink,
        window=window,
        seed=config.seed,
        temperature=config.temperature,
    )
    result = generate(make_target(target.lm, target.fresh(), config, Standard()), drafter, config)
    result.prefill_s = target.prefill_s
    result.extra.update(dropped=drafter.dropped, sink=sink, window=window)
    return result
