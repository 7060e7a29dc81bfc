"""The one autoregressive loop, and the two ways its tokens are drawn.

Every plain-decoding path runs `decode_steps`: device-only generation
(`tandem.protocols.local`), the cloud-AR and device-only baselines of the speculative modes
(`tandem.baselines.spec_baselines`), RAPID's LC and RAG baselines
(`tandem.protocols.rapid.engine.autoregressive`) and each document row of the DRAGON
baselines (`tandem.baselines.dragon.context`). From a prefilled state it draws the next token
from the last logits, yields it, stops after `max_new_tokens` or at `eos`, and otherwise
feeds the token back (one forward pass per token, run when the caller asks for the next one,
so an async caller can run each step in a worker thread).

What differs between callers is only the `Draw` (logits [vocab], output position -> token):

- `stream_draw(seed, ...)`: one `torch.Generator`, seeded once and consumed in order
  (device-only generation; RAPID's baselines, seeded seed + 1 like RAPID's verifier);
- `position_draw(seed, purpose, ...)`: a fresh generator per position
  (`tandem.sampling.seeds`), so the token at a position does not depend on the draws before
  it; the speculative modes use it, and so do their baselines, so that cloud AR and every
  exact mode draw the same token at the same position;
- DRAGON's rows keep their own draw (`tandem.baselines.dragon.context.next_token`: greedy
  argmax, else a softmax draw with the "context" position seed).

At temperature 0 every draw is the argmax, so all callers agree with plain greedy decoding.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import torch

from tandem.codecs import sample_token
from tandem.models.base import CausalLM, State
from tandem.sampling.seeds import position_generator
from tandem.sampling.warp import sample, warp

Draw = Callable[[torch.Tensor, int], int]  # (next-token logits [vocab], position) -> token
OnToken = Callable[[int], None]  # every mode streams its output tokens through this, in order


def after_tokens(on_token: OnToken | None, count: int | None, then: Callable[[], None]) -> OnToken:
    """`on_token`, plus `then()` once the `count`-th token has passed it (None or 0: never);
    e.g. a crash test or demo that kills the cloud mid-generation."""
    seen = 0

    def tap(token: int) -> None:
        nonlocal seen
        seen += 1
        if on_token is not None:
            on_token(token)
        if count and seen == count:
            then()

    return tap


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces without splitting multi-byte characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd"):  # incomplete UTF-8 sequence: wait for more tokens
            return ""
        piece, self.emitted = text[len(self.emitted) :], text
        return piece


def text_stream(
    tokenizer, show: Callable[[str], None] | None = None, *, eos: int | None = None
) -> OnToken:
    """An `OnToken` that shows the output as text pieces (default: written to stdout at once);
    `eos` itself is not shown."""
    detok = IncrementalDetokenizer(tokenizer)

    def on_token(token: int) -> None:
        if token != eos:
            piece = detok.push(token)
            if show is not None:
                show(piece)
            else:
                sys.stdout.write(piece)
                sys.stdout.flush()

    return on_token


def stream_draw(
    seed: int, *, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> Draw:
    """Draws from the warped law with one generator seeded once, consumed in order."""
    generator = torch.Generator().manual_seed(seed)

    def draw(logits: torch.Tensor, position: int) -> int:
        probs = warp(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        return int(sample(probs, generator))

    return draw


def position_draw(
    seed: int,
    purpose: str,
    *,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Draw:
    """Draws from the warped law with the generator of (seed, purpose, position)."""

    def draw(logits: torch.Tensor, position: int) -> int:
        probs = warp(logits, temperature=temperature, top_k=top_k, top_p=top_p)
        return sample_token(probs, position_generator(seed, purpose, position))

    return draw


def decode_steps(
    lm: CausalLM, state: State, draw: Draw, *, max_new_tokens: int, eos: int | None
) -> Iterator[int]:
    """Tokens from a prefilled single-row `state`, one per `next()`: at most
    `max_new_tokens`, ending at the first `eos` (yielded). The last token is not fed to the
    model; every other one is, just before the next token is drawn."""
    token: int | None = None
    for position in range(max_new_tokens):
        if token is not None:
            lm.decode(state, [token])
        token = draw(state.logits[0], position)
        yield token
        if token == eos:
            return
