"""A sans-I/O driver of the eager pipeline ("the cloud never idles") for law tests: an
`EagerDrafter` and an `EagerVerifier` stepped by a *schedule*, every request and verdict
built by tandem.protocols.spec.wire as over the network, no event loop, no clock.

A schedule is a string of events, repeated until the device has its output:
    d  the device drafts one token (if it may)       s  it sends its unsent drafts
    b  the device drafts its open branch (if one is due) and sends it
    v  the cloud admits the oldest request and verifies what is left of it
    a  the cloud commits one token by itself (AR step) and sends it down
    r  the device adopts the oldest message from the cloud    R  every message waiting
The order of events, not their timing, is what a real run varies; a law test runs several.

`Oracle` makes the randomness enumerable: with `branching(oracle)` active, every random draw
of the two state objects (draft sampling, the accept test and residual, the AR sample) asks
the oracle, which takes a scripted branch and multiplies the path's probability; `law(run)`
walks every branch (depth first) and sums the probability of each output.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

from tandem.codecs import make_codec
from tandem.codecs.base import Draft
from tandem.protocols.spec import drafter as drafter_module
from tandem.protocols.spec import eager as eager_module
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.eager import EagerDrafter, EagerVerifier
from tandem.sampling import acceptance as acceptance_module
from tandem.sampling.speculative import Verdict

MAX_EVENTS = 2000


def run_schedule(
    draft_lm, target_lm, prompt, config: SpecConfig, schedule: str, *, send_if=None, counts=None
):
    """The output of one eager generation driven by `schedule` (module docstring).
    `send_if(drafter)`: extra condition on "s" (a test plants a faulty one); `counts`: a dict
    that gets the branches promoted on each side added."""
    drafter = EagerDrafter(draft_lm, prompt, config, eos_id=None)
    verifier = EagerVerifier(target_lm, prompt, config, eos_id=None)
    drafter.prefill()
    verifier.prefill()
    drafter.lookahead = 4 * config.draft_len
    codec = make_codec(config.codec, **config.codec_params)
    uplink, downlink, seq = [], [], 0
    for step in range(MAX_EVENTS):
        if drafter.done:
            assert verifier.committed[: drafter.frontier] == drafter.committed
            if counts is not None:
                counts["device"] = counts.get("device", 0) + drafter.branches["promoted"]
                counts["cloud"] = counts.get("cloud", 0) + verifier.branches
            return tuple(drafter.committed)
        event = schedule[step % len(schedule)]
        if event == "d" and drafter.can_draft():
            drafter.draft_next()
        elif event == "s" and drafter.unsent and (send_if is None or send_if(drafter)):
            seq += 1
            uplink.append(wire.request_message(seq, drafter.take_chunk(), config.codec))
        elif event == "b" and drafter.branch_due():
            seq += 1
            uplink.append(wire.request_message(seq, drafter.draft_branch(), config.codec))
        elif event == "v" and uplink:
            request = wire.parse_request(
                uplink.pop(0), codec_name=config.codec, codec=codec, vocab_size=target_lm.vocab_size
            )
            plan = verifier.admit(request).verify
            if plan is not None:
                result = verifier.verify(plan)
                tokens = tuple(verifier.committed[result.position :])
                downlink.append(wire.eager_result_message(result, tokens))
        elif event == "a" and not verifier.done:
            token = verifier.ar_step()
            downlink.append(wire.token_message(verifier.frontier - 1, token, 0.0))
        elif event in "rR":
            for msg in downlink[: 1 if event == "r" else len(downlink)]:
                fields = wire.parse_token(msg) if hasattr(msg, "token") else wire.parse_result(msg)
                drafter.adopt(fields["position"], fields["tokens"])
            del downlink[: 1 if event == "r" else len(downlink)]
    raise AssertionError(f"schedule {schedule!r} made no output in {MAX_EVENTS} events")


class Oracle:
    """Scripted branch choices; records every choice point and the path's probability."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.taken: list[int] = []
        self.options: list[int] = []
        self.prob = 1.0

    def choose(self, options: list[tuple[object, float]]):
        index = len(self.taken)
        k = self.script[index] if index < len(self.script) else 0
        self.taken.append(k)
        self.options.append(len(options))
        value, weight = options[k]
        self.prob *= weight
        return value


def _normalized(probs: torch.Tensor) -> torch.Tensor:
    probs = probs.double()
    return probs / probs.sum()


@contextlib.contextmanager
def branching(oracle_ref: list):
    """Route the state objects' random draws to `oracle_ref[0]` (an Oracle)."""

    def draft(codec, draft_probs, generator):
        payload = codec.encode(draft_probs)
        sent_probs = codec.transmitted_probs(draft_probs)
        codec.observe(draft_probs)
        law = _normalized(sent_probs)
        options = [(t, float(law[t])) for t in range(law.shape[0]) if float(law[t]) > 0]
        return Draft(token=oracle_ref[0].choose(options), sent_probs=sent_probs, payload=payload)

    def sample_one(probs, generator):
        law = _normalized(probs)
        options = [(t, float(law[t])) for t in range(law.shape[0]) if float(law[t]) > 0]
        return oracle_ref[0].choose(options)

    def judge(rule, draft_tokens, draft_probs, target_probs, draws):
        # the statement, position by position: accept x ~ q with min(1, p(x)/q(x)), else
        # draw norm(max(0, p - q)) and stop; a fully accepted block's bonus is not drawn
        # (the eager cloud never sends one: a -1 would show up in the output)
        laws = rule.laws(target_probs, draft_probs)
        for i, token in enumerate(int(t) for t in draft_tokens):
            draft_law, target_law = _normalized(draft_probs[i]), _normalized(laws.verify[i])
            accept = min(1.0, float(target_law[token] / draft_law[token]))
            options: list[tuple[object, float]] = []
            if accept > 0:
                options.append((None, accept))
            if accept < 1:
                residual = _normalized((target_law - draft_law).clamp_min(0.0))
                options += [(y, (1 - accept) * float(residual[y])) for y in range(len(residual))]
                options = [(v, w) for v, w in options if w > 0]
            outcome = oracle_ref[0].choose(options)
            if outcome is not None:
                accepted = tuple(int(t) for t in draft_tokens[:i])
                return Verdict(i, outcome, False, accepted), laws
        accepted = tuple(int(t) for t in draft_tokens)
        return Verdict(len(accepted), -1, True, accepted), laws

    # the verifier judges through `acceptance.judge_logits`, which calls `acceptance.judge`
    saved = (drafter_module.qs_draft, eager_module.sample_at, acceptance_module.judge)
    drafter_module.qs_draft, acceptance_module.judge = draft, judge
    eager_module.sample_at = lambda probs, seed, purpose, position: sample_one(probs, None)
    try:
        yield
    finally:
        drafter_module.qs_draft, eager_module.sample_at, acceptance_module.judge = saved


def law(run) -> dict[tuple[int, ...], float]:
    """Probability of each output of `run()` over every branch of its random draws."""
    found: dict[tuple[int, ...], float] = defaultdict(float)
    ref: list = [None]
    pending: list[list[int]] = [[]]
    with branching(ref):
        while pending:
            script = pending.pop()
            ref[0] = oracle = Oracle(script)
            found[run()] += oracle.prob
            for index in range(len(script), len(oracle.taken)):
                for alt in range(1, oracle.options[index]):
                    pending.append(oracle.taken[:index] + [alt])
    return dict(found)
