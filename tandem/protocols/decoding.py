"""The one decoding core: a drafter proposes, a target verifies, rounds repeat; plain
autoregressive decoding is the same loop with no drafter.

Words used here:
- *round*: the drafter proposes n tokens with their laws (n = 0 without a drafter), the
  target scores the pending token and the drafts in one forward pass and judges them with
  the one rejection sampler under its acceptance rule (`tandem.sampling.acceptance`: the
  target's own law, or RAPID's augmented one), keeps `num_accepted` and emits one *next
  token* (recovered at the first rejection, else the bonus). A round emits
  num_accepted + 1 tokens; without drafts it is one decoding step.
- *pending*: the last emitted token, not yet in the target's KV cache; it is fed with the
  next block, so each round costs the target one forward pass and the last token is never
  fed.
- *draws*: one seeding scheme (`tandem.sampling.seeds`): the drafter's token at output
  position p uses the generator of (seed, "draft", p), the target's test and next token
  there that of (seed, "verify", p) (DRAGON's baseline rows: "context"). So the token at a
  position never depends on the draws before it, a run split over a network draws what the
  local run draws, and at temperature 0 every path is plain greedy decoding.

Who runs it: RAPID and its SD / StreamingLLM baselines (`tandem.protocols.rapid.engine`,
`tandem.baselines.rapid_baselines`: with a drafter); device-only generation
(`tandem.protocols.local`), the cloud-AR and device-only baselines of the speculative modes
(`tandem.baselines.spec_baselines`), RAPID's LC and RAG baselines and each document row of
the DRAGON baselines (`tandem.baselines.dragon.context`): without one (`decode_steps`). The
pipelined edge-cloud modes (`tandem.protocols.spec`) verify with the same sampler and rules
in their own cloud state object, whose requests arrive over the network out of step with
any loop. `Rounds` is the loop's bookkeeping, without I/O; RAPID's device half over the
network (`tandem.protocols.rapid.edge`) drives one too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import torch

from tandem.models.base import CausalLM, State
from tandem.sampling.acceptance import Rule, Standard, judge_logits
from tandem.sampling.seeds import PositionDraws
from tandem.sampling.speculative import Verdict

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


class Drafter(Protocol):
    def propose(self, count: int, position: int) -> tuple[list[int], torch.Tensor]:
        """`count` tokens for output positions position.. and the laws they were drawn from,
        [count or count + 1, vocab] float32 (one more: the law at the bonus position)."""
        ...

    def accept(self, num_accepted: int, next_token: int) -> None:
        """The target kept the first `num_accepted` drafts and then emitted `next_token`."""
        ...


class Target:
    """The verifier: a target model holding a prefilled one-row `state`.

    `verify(position, drafts, draft_probs)` runs one forward pass over the pending token and
    the drafts, warps the rows (`temperature`, `top_k`, `top_p`), judges the block under
    `rule` with the position draws of (`seed`, `purpose`), rolls the rejected drafts out of
    the cache and keeps the next token pending."""

    def __init__(
        self,
        lm: CausalLM,
        state: State,
        *,
        seed: int,
        temperature: float,
        top_k: int | None = None,
        top_p: float | None = None,
        rule: Rule | None = None,
        purpose: str = "verify",
    ):
        self.lm, self.state, self.seed, self.purpose = lm, state, seed, purpose
        self.sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        self.rule = rule if rule is not None else Standard()
        self.prompt_logits = state.logits[:1].clone()  # [1, vocab] predicts output position 0
        self.pending: list[int] = []

    def verify(
        self,
        position: int,
        drafts: list[int],
        draft_probs: torch.Tensor | None = None,  # [n or n + 1, vocab]
    ) -> Verdict:
        n = len(drafts)
        feed = self.pending + list(drafts)
        if not feed:
            logits = self.prompt_logits
        else:
            rows = self.lm.decode(self.state, [feed])[0]  # [len(feed), vocab]
            logits = rows if self.pending else torch.cat([self.prompt_logits, rows])
        assert logits.shape[0] == n + 1, (logits.shape, n)
        verdict, _ = judge_logits(
            self.rule,
            torch.tensor(drafts, dtype=torch.int64),
            draft_probs,
            logits,
            PositionDraws(self.seed, self.purpose, position),
            sampling=self.sampling,
        )
        self.lm.rollback(self.state, n - verdict.num_accepted)
        self.pending = [verdict.next_token]
        return verdict


class Rounds:
    """The bookkeeping of rounds, without I/O: how many tokens to draft next, when to stop,
    what the output is (at most `max_new_tokens`, ending at the first `eos`).

    Per round: `block()` drafts to propose (0 with `gamma` 0: a plain decoding step), the
    caller has them verified, then `record(drafts, num_accepted, next_token)` returns the
    output tokens that round made final (for streaming). `draft_s` / `verify_s` hold the
    time the driver spent in each half (the driver's clock, not this object's)."""

    def __init__(self, *, gamma: int, max_new_tokens: int, eos: int | None):
        self.gamma, self.max_new_tokens, self.eos = gamma, max_new_tokens, eos
        self.tokens: list[int] = []  # every verified token, maybe past the limit or eos
        self.per_round: list[int] = []
        self.drafted = 0
        self.emitted = 0
        self.draft_s = self.verify_s = 0.0

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens or (
            self.eos is not None and self.eos in self.tokens
        )

    def block(self) -> int:
        return min(self.gamma, max(1, self.max_new_tokens - len(self.tokens) - 1))

    def record(self, drafts: list[int], num_accepted: int, next_token: int) -> list[int]:
        self.drafted += len(drafts)
        self.per_round.append(num_accepted)
        self.tokens.extend([*drafts[:num_accepted], next_token])
        new = self.output()[0][self.emitted :]
        self.emitted += len(new)
        return new

    def output(self) -> tuple[list[int], str]:
        """The answer so far and why it ends ("eos" or "length")."""
        tokens, eos = self.tokens[: self.max_new_tokens], self.eos
        if eos is not None and eos in tokens:
            return tokens[: tokens.index(eos) + 1], "eos"
        return tokens, "length"


def run_rounds(target: Target, drafter: Drafter | None, rounds: Rounds) -> Iterator[list[int]]:
    """The one decoding loop: rounds until `rounds` is done; yields each round's new output
    tokens. One round runs per `next()`, so an async caller can run each in a worker
    thread."""
    while not rounds.done:
        position = len(rounds.tokens)
        count = rounds.block() if drafter is not None else 0
        t0 = time.perf_counter()
        drafts, draft_probs = drafter.propose(count, position) if count else ([], None)
        t1 = time.perf_counter()
        verdict = target.verify(position, drafts, draft_probs)
        if drafter is not None:
            drafter.accept(verdict.num_accepted, verdict.next_token)
        rounds.draft_s += t1 - t0
        rounds.verify_s += time.perf_counter() - t1
        yield rounds.record(drafts, verdict.num_accepted, verdict.next_token)


def decode_steps(
    lm: CausalLM,
    state: State,
    *,
    seed: int,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int,
    eos: int | None,
    purpose: str = "verify",
) -> Iterator[int]:
    """Plain decoding from a prefilled one-row `state`: the loop with no drafter, one token
    per `next()`, at most `max_new_tokens`, ending at the first `eos` (yielded)."""
    target = Target(
        lm, state, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p, purpose=purpose
    )
    rounds = Rounds(gamma=0, max_new_tokens=max_new_tokens, eos=eos)
    for tokens in run_rounds(target, None, rounds):
        yield from tokens
