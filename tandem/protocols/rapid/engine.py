"""RAPID (Algorithm 1) on the one decoding core: the RAG drafter proposes, the long-context
target verifies under the augmented rule (`tandem.protocols.decoding.run_rounds`,
`tandem.sampling.acceptance.Augmented`).

Words used here:
- *round*: see `tandem.protocols.decoding` (gamma drafts, one target forward pass,
  num_accepted + 1 tokens).
- *acceptance rate*: accepted draft tokens / drafted tokens (the paper's Fig. 3 and Table 2).
- draws: the one position scheme (drafter: (seed, "draft", p), target: (seed, "verify", p)),
  so the same run split over a network (tandem.protocols.rapid.edge) gives the same tokens
  as the local one, and LC decoding draws what the target's test would.
- timings: *prefill_s* = retrieval + target prefill + drafter prefill; *decode_s* = the
  rounds (drafting + verification); decode throughput = tokens / decode_s (the paper's
  speedup is a ratio of decode throughputs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.codecs import Codec
from tandem.errors import TandemError
from tandem.models.base import CausalLM, State
from tandem.protocols.decoding import Drafter, Rounds, Target, run_rounds
from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
from tandem.protocols.rapid.drafter import ModelDrafter
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.retrieval import RetrievedContext, retrieve
from tandem.protocols.rapid.states import Prefilled
from tandem.protocols.report import Headline
from tandem.retrieval.embedder import Embedder
from tandem.sampling.acceptance import Augmented, Rule, Standard


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


def make_rule(config: RapidConfig) -> Augmented:
    return Augmented(
        eta=config.eta, mode=config.mode, tail=config.tail, tail_ratio=config.tail_ratio
    )


def make_target(lm: CausalLM, state: State, config: RapidConfig, rule: Rule) -> Target:
    return Target(lm, state, seed=config.seed, temperature=config.temperature, rule=rule)


def eos_id(lm: CausalLM, config: RapidConfig) -> int | None:
    return lm.tokenizer.eos_token_id if config.stop_at_eos else None


def result_of(rounds: Rounds, tokenizer, **timings) -> RapidResult:
    """The RapidResult of finished rounds (`timings`: prefill_s, decode_s, extra, ...)."""
    tokens, finish = rounds.output()
    timings.setdefault("draft_s", rounds.draft_s)
    timings.setdefault("verify_s", rounds.verify_s)
    return RapidResult(
        tokens=tokens,
        text=tokenizer.decode(tokens),
        rounds=len(rounds.per_round),
        drafted=rounds.drafted,
        accepted=sum(rounds.per_round),
        accepted_per_round=list(rounds.per_round),
        finish_reason=finish,
        **timings,
    )


def generate(target: Target, drafter: Drafter | None, config: RapidConfig) -> RapidResult:
    """Rounds until `max_new_tokens` tokens (or eos) are emitted; no drafter: plain decoding
    (LC, RAG). Timings exclude prefills."""
    rounds = Rounds(
        gamma=config.gamma if drafter is not None else 0,
        max_new_tokens=config.max_new_tokens,
        eos=eos_id(target.lm, config),
    )
    start = time.perf_counter()
    for _ in run_rounds(target, drafter, rounds):
        pass
    decode_s = time.perf_counter() - start
    return result_of(rounds, target.lm.tokenizer, prefill_s=0.0, decode_s=decode_s)


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
        rule = Standard() if plain else make_rule(config)
    result = generate(
        make_target(target.lm, target.fresh(), config, rule),
        ModelDrafter(
            drafter.lm,
            drafter.fresh(),
            seed=config.seed,
            temperature=config.temperature,
            bonus_row=config.draft_bonus_row and not plain,
            codec=codec,
        ),
        config,
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
