"""The RAPID loop (Algorithm 1): the RAG drafter proposes, the long-context target verifies.

Words used here:
- *round*: the drafter proposes gamma tokens (with their laws), the target scores them in one
  forward pass and keeps `num_accepted` of them, then emits one *next token* (recovered at the
  first rejection, or the bonus token). A round emits num_accepted + 1 tokens.
- *acceptance rate*: accepted draft tokens / drafted tokens (the paper's Fig. 3 and Table 2).
- *draft generator* / *verify generator*: the drafter samples with one `torch.Generator`
  (seed), the verifier with another (seed + 1), so the same run split over a network
  (tandem.protocols.rapid.edge) gives the same tokens as the local one.
- timings: *prefill_s* = retrieval + target prefill + drafter prefill; *decode_s* = the
  rounds (drafting + verification); decode throughput = tokens / decode_s (the paper's
  speedup is a ratio of decode throughputs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tandem.codecs import Codec
from tandem.errors import TandemError
from tandem.models.base import CausalLM, State
from tandem.protocols.decoding import decode_steps, stream_draw
from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
from tandem.protocols.rapid.drafter import Drafter, ModelDrafter
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.retrieval import RetrievedContext, retrieve
from tandem.protocols.rapid.states import Prefilled
from tandem.protocols.rapid.target import PlainRule, RapidRule, Rule, TargetVerifier
from tandem.protocols.report import Headline
from tandem.retrieval.embedder import Embedder


@dataclass
class RapidResult:
    tokens: list[int]
    text: str
    rounds: int  # forward passes of the target during decoding
    drafted: int
    accepted: int
    accepted_per_round: list[int]
    prefill_s: float
    decode_s: float
    draft_s: float = 0.0
    verify_s: float = 0.0
    finish_reason: str = "length"
    extra: dict = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: generated tokens / decoding time."""
        return self.headline().tokens_per_s

    def headline(self) -> Headline:
        """Rounds are timed, not tokens: no TTFT; the decode time covers every token."""
        extra = self.extra
        return Headline(
            mode="rapid",
            tokens=len(self.tokens),
            ttft_s=None,
            decode_tokens=len(self.tokens),
            decode_s=self.decode_s,
            finish_reason=self.finish_reason,
            uplink_bytes=int(extra.get("uplink_bytes", 0)),
            downlink_bytes=int(extra.get("downlink_bytes", 0)),
        )


def make_rule(config: RapidConfig) -> Rule:
    return RapidRule(
        eta=config.eta,
        temperature=config.temperature,
        mode=config.mode,
        tail=config.tail,
        tail_ratio=config.tail_ratio,
    )


def eos_id(lm: CausalLM, config: RapidConfig) -> int | None:
    return lm.tokenizer.eos_token_id if config.stop_at_eos else None


def _finish(tokens: list[int], eos: int | None, limit: int) -> tuple[list[int], str]:
    if eos is not None and eos in tokens[:limit]:
        return tokens[: tokens.index(eos) + 1], "eos"
    return tokens[:limit], "length"


class Rounds:
    """The bookkeeping of speculative rounds, without I/O: how many tokens to draft next, when
    to stop, what the output is. The local loop (`speculative_generate`) and the device half of
    the split (`edge.device_generate`) drive one each, so both stop and cut alike.

    Per round: `block()` (0: done), the caller drafts that many and has them verified, then
    `record(drafts, num_accepted, next_token)`, which returns the output tokens that round
    made final (for streaming)."""

    def __init__(self, *, gamma: int, max_new_tokens: int, eos: int | None):
        self.gamma, self.max_new_tokens, self.eos = gamma, max_new_tokens, eos
        self.tokens: list[int] = []  # every verified token, maybe past the limit or eos
        self.per_round: list[int] = []
        self.drafted = 0
        self.emitted = 0

    def block(self) -> int:
        if len(self.tokens) >= self.max_new_tokens or (
            self.eos is not None and self.eos in self.tokens
        ):
            return 0
        return max(1, min(self.gamma, self.max_new_tokens - len(self.tokens) - 1))

    def record(self, drafts: list[int], num_accepted: int, next_token: int) -> list[int]:
        self.drafted += len(drafts)
        self.per_round.append(num_accepted)
        self.tokens.extend([*drafts[:num_accepted], next_token])
        new = self.output()[0][self.emitted :]
        self.emitted += len(new)
        return new

    def output(self) -> tuple[list[int], str]:
        """The answer so far (at most max_new_tokens, ending at the first eos) and why it ends."""
        return _finish(self.tokens, self.eos, self.max_new_tokens)

    def result(self, tokenizer, **timings) -> RapidResult:
        tokens, finish = self.output()
        return RapidResult(
            tokens=tokens,
            text=tokenizer.decode(tokens),
            rounds=len(self.per_round),
            drafted=self.drafted,
            accepted=sum(self.per_round),
            accepted_per_round=list(self.per_round),
            finish_reason=finish,
            **timings,
        )


def speculative_generate(
    target: TargetVerifier,
    drafter: Drafter,
    *,
    gamma: int,
    max_new_tokens: int,
    seed: int,
    eos: int | None,
) -> RapidResult:
    """Rounds until `max_new_tokens` tokens (or eos) are emitted. Timings exclude prefills."""
    draft_generator = torch.Generator().manual_seed(seed)
    verify_generator = torch.Generator().manual_seed(seed + 1)
    rounds = Rounds(gamma=gamma, max_new_tokens=max_new_tokens, eos=eos)
    draft_s = verify_s = 0.0
    start = time.perf_counter()
    while block := rounds.block():
        t0 = time.perf_counter()
        drafts, draft_probs = drafter.draft(block, draft_generator)
        t1 = time.perf_counter()
        verdict = target.verify(drafts, draft_probs, verify_generator)
        t2 = time.perf_counter()
        drafter.accept(verdict.num_accepted, verdict.next_token)
        draft_s, verify_s = draft_s + t1 - t0, verify_s + t2 - t1
        rounds.record(drafts, verdict.num_accepted, verdict.next_token)
    decode_s = time.perf_counter() - start
    return rounds.result(
        target.lm.tokenizer, prefill_s=0.0, decode_s=decode_s, draft_s=draft_s, verify_s=verify_s
    )


def autoregressive(
    lm: CausalLM,
    state: State,
    *,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    eos: int | None,
) -> RapidResult:
    """Plain decoding from a prefilled state (the LC and RAG baselines)."""
    draw = stream_draw(seed + 1, temperature=temperature)
    start = time.perf_counter()
    tokens = list(decode_steps(lm, state, draw, max_new_tokens=max_new_tokens, eos=eos))
    decode_s = time.perf_counter() - start
    tokens, finish = _finish(tokens, eos, max_new_tokens)
    return RapidResult(
        tokens=tokens,
        text=lm.tokenizer.decode(tokens),
        rounds=len(tokens),
        drafted=0,
        accepted=0,
        accepted_per_round=[],
        prefill_s=0.0,
        decode_s=decode_s,
        finish_reason=finish,
    )


def check_pair(target_lm: CausalLM, drafter_lm: CausalLM) -> None:
    if target_lm.tokenizer.fingerprint != drafter_lm.tokenizer.fingerprint:
        raise TandemError(
            f"drafter {drafter_lm.name} and target {target_lm.name} use different tokenizers"
        )


def rapid(
    target: Prefilled,
    drafter: Prefilled,
    config: RapidConfig,
    *,
    plain: bool = False,
    codec: Codec | None = None,
    rule: Rule | None = None,
) -> RapidResult:
    """RAPID rounds from prefilled prompts (target: C + question; drafter: C^S + question).

    `plain=True` verifies against the target's own law: naive SD with the same RAG drafter.
    `codec`: drafts are sampled from its transmitted law (as the edge-cloud split does).
    `rule`: verify with this rule instead of the one `config` names (e.g. an auditing wrapper).
    """
    check_pair(target.lm, drafter.lm)
    if rule is None:
        rule = PlainRule(temperature=config.temperature) if plain else make_rule(config)
    result = speculative_generate(
        TargetVerifier(target.lm, target.fresh(), rule),
        ModelDrafter(
            drafter.lm,
            drafter.fresh(),
            temperature=config.temperature,
            bonus_row=config.draft_bonus_row and not plain,
            codec=codec,
        ),
        gamma=config.gamma,
        max_new_tokens=config.max_new_tokens,
        seed=config.seed,
        eos=eos_id(target.lm, config),
    )
    result.prefill_s = target.prefill_s + drafter.prefill_s
    return result


def run_rapid(
    target_lm: CausalLM,
    drafter_lm: CausalLM,
    context: str,
    question: str,
    *,
    config: RapidConfig,
    embedder: Embedder | None = None,
    retrieval: RetrievalConfig | None = None,
    retrieved: RetrievedContext | None = None,
    plain: bool = False,
) -> RapidResult:
    """One RAPID generation from text: retrieve C^S (unless given), prefill both, run rounds."""
    check_pair(target_lm, drafter_lm)
    if retrieved is None:
        if embedder is None:
            raise TandemError("RAPID needs an embedder to retrieve the drafter's context")
        retrieved = retrieve(context, question, drafter_lm.tokenizer, embedder, retrieval)
    target = Prefilled(target_lm, target_prompt(target_lm.tokenizer, context, question))
    drafter = Prefilled(drafter_lm, drafter_prompt(drafter_lm.tokenizer, retrieved.text, question))
    result = rapid(target, drafter, config, plain=plain)
    result.prefill_s += retrieved.retrieve_s
    result.extra.update(
        retrieved_tokens=retrieved.tokens,
        context_tokens=retrieved.context_tokens,
        budget=retrieved.budget,
        retrieve_s=retrieved.retrieve_s,
    )
    return result
