"""SQS-SD Fig. 2 analogue: uplink bits per draft token and resampling vs temperature, per codec.

Method (says what is measured and what is modelled):
- *contexts*: each prompt + the target's greedy continuation (the cloud-AR outputs of the
  main benchmark), scored once by the draft and once by the target model (teacher forcing):
  logit rows for every position, as in SQS-SD's bound (contexts drawn from the target).
- per temperature T and codec: the draft row is warped, quantized (`transmitted_probs`, the
  law drafts are sampled from) and its payload bits counted; the exact acceptance probability
  of a draft from the sent law is sum(min(sent, target)) (no sampling noise).
- *batches* as in SQS-SD Sec. 4: from the current position, L = the most tokens whose bits
  fit in B (at least one); acceptances are drawn with a seeded generator, the batch ends at the first
  rejection (which is resampled) or after L tokens (+1 bonus); C-SQS's threshold backtracks
  to the last accepted token (Algorithm 1). Resampling rate = rejections / batches (SQS-SD's
  metric; it tends to 1 when L is long). Batch-free: *rejection per position* = mean over every
  position of TV(sent, target), the probability a draft made there is rejected (Theorem 1).
- *latency* (modelled, per generated token): L * t_draft_token + bits / uplink rate + RTT
  + t_verify, with the per-token times measured on this machine.
- bits: measured payload bits (whole bytes) vs SQS-SD's formula (Eqs. 1, 2, 5:
  log2 C(V, K) + log2 C(l + K - 1, K - 1), plus log2 V for C-SQS), real-valued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tandem.codecs import make_codec
from tandem.sampling.warp import warp

TEMPERATURES = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_CSQS = {"alpha": 0.0005, "eta": 0.001, "ell": 100, "beta": 0.001}
CODECS: dict[str, tuple[str, dict]] = {
    "dense": ("dense", {}),
    "k-sqs K=3": ("k-sqs", {"k": 3, "ell": 100}),
    "k-sqs K=4": ("k-sqs", {"k": 4, "ell": 100}),
    "k-sqs K=8": ("k-sqs", {"k": 8, "ell": 100}),
    "k-sqs K=16": ("k-sqs", {"k": 16, "ell": 100}),
    "k-sqs K=32": ("k-sqs", {"k": 32, "ell": 100}),
    "c-sqs paper": ("c-sqs", PAPER_CSQS),
    "c-sqs a=0.01": ("c-sqs", {"alpha": 0.01, "eta": 0.01, "ell": 100, "beta": 0.01}),
    "c-sqs a=0.02": ("c-sqs", {"alpha": 0.02, "eta": 0.02, "ell": 50, "beta": 0.02}),
    "c-sqs a=0.05": ("c-sqs", {"alpha": 0.05, "eta": 0.05, "ell": 50, "beta": 0.05}),
}


@dataclass(frozen=True)
class Timing:
    draft_token_s: float
    verify_s: float
    rtt_s: float
    uplink_mbit: float


def log2_binomial(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)


def formula_bits(name: str, params: dict, vocab: int, support: int) -> float:
    """SQS-SD's bit count for one token (real-valued)."""
    if name == "dense":
        return 16.0 * vocab
    ell = int(params.get("ell", 100))
    bits = log2_binomial(vocab, support) + log2_binomial(ell + support - 1, support - 1)
    return bits + (math.log2(vocab) if name == "c-sqs" else 0.0)


def support_size(codec, probs: torch.Tensor) -> int:
    """K of an SQS payload (k-sqs: fixed; c-sqs: the conformal support), else nonzeros."""
    from tandem.codecs.base import as_numpy_probs

    if hasattr(codec, "support"):
        return int(codec.support(as_numpy_probs(probs)).shape[0])
    return int((probs > 0).sum())


def position_tv(rows, codec_name: str, params: dict, temperature: float) -> float:
    """Mean over every position of TV(sent, target) = the probability that a draft made there
    is rejected (SQS-SD Theorem 1's quantity), the codec's state stepping at every position."""
    total, count = 0.0, 0
    for draft_rows, target_rows in rows:
        codec = make_codec(codec_name, **params)
        draft_probs = warp(draft_rows, temperature=temperature)
        target_probs = warp(target_rows, temperature=temperature)
        for probs, target in zip(draft_probs, target_probs, strict=True):
            total += 1.0 - float(torch.minimum(codec.transmitted_probs(probs), target).sum())
            codec.observe(probs)
            count += 1
    return total / count


def score_contexts(draft_lm, target_lm, sequences: list[tuple[list[int], list[int]]]):
    """[(draft rows, target rows)] per sequence: rows predicting each continuation token."""
    out = []
    for prompt, continuation in sequences:
        ids = prompt + continuation
        start = len(prompt) - 1
        rows = slice(start, start + len(continuation))
        out.append((draft_lm.score(ids)[rows], target_lm.score(ids)[rows]))
    return out


def simulate(
    rows: list[tuple[torch.Tensor, torch.Tensor]],
    codec_name: str,
    params: dict,
    temperature: float,
    *,
    budget_bits: int,
    timing: Timing,
    seed: int = 0,
) -> dict:
    """One codec at one temperature over every sequence (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    batches = rejections = drafted = tokens = 0
    bits_sum = formula_sum = accept_sum = latency = 0.0
    for draft_rows, target_rows in rows:
        codec = make_codec(codec_name, **params)
        draft_probs = warp(draft_rows, temperature=temperature)  # [n, vocab]
        target_probs = warp(target_rows, temperature=temperature)
        position, n = 0, draft_rows.shape[0]
        while position < n:
            batch_bits, accepted, rejected, length = 0, 0, False, 0
            while position + length < n:
                probs = draft_probs[position + length]
                bits = 8 * len(codec.encode(probs))
                if length and batch_bits + bits > budget_bits:
                    break
                sent = codec.transmitted_probs(probs)
                formula_sum += formula_bits(
                    codec_name, params, probs.shape[0], support_size(codec, probs)
                )
                codec.observe(probs)
                batch_bits += bits
                length += 1
                accept = float(torch.minimum(sent, target_probs[position + length - 1]).sum())
                accept_sum += accept
                if not rejected:
                    if float(torch.rand((), generator=generator)) < accept:
                        accepted += 1
                    else:
                        rejected = True
            drafted += length
            bits_sum += batch_bits
            batches += 1
            rejections += rejected
            codec.backtrack(accepted)
            emitted = min(accepted + 1, n - position)
            tokens += emitted
            position += emitted
            latency += (
                length * timing.draft_token_s
                + batch_bits / (timing.uplink_mbit * 1e6)
                + timing.rtt_s
                + timing.verify_s
            )
    return {
        "codec": codec_name,
        "params": params,
        "temperature": temperature,
        "bits_per_draft": bits_sum / drafted,
        "formula_bits_per_draft": formula_sum / drafted,
        "draft_tokens_per_batch": drafted / batches,
        "acceptance": accept_sum / drafted,
        "rejection_per_draft": 1.0 - accept_sum / drafted,
        "resampling_rate": rejections / batches,
        "latency_per_token_s": latency / tokens,
    }


def sweep(rows, *, budget_bits: int, timing: Timing, temperatures=TEMPERATURES) -> list[dict]:
    results = []
    for temperature in temperatures:
        for label, (name, params) in CODECS.items():
            result = simulate(
                rows, name, params, temperature, budget_bits=budget_bits, timing=timing
            )
            result["rejection_per_position"] = position_tv(rows, name, params, temperature)
            results.append({"label": label, **result})
    return results


def separate_tv(rows, *, ks=(1, 5, 10, 50), temperatures=TEMPERATURES) -> list[dict]:
    """PicoSpec's separate rejection with a top-K downlink: mean TV between the law it emits
    and the target's, over every position (DESIGN errata 3), per K and temperature."""
    from tandem.protocols.spec import separate

    out = []
    for temperature in temperatures:
        pairs = [
            (warp(d, temperature=temperature), warp(t, temperature=temperature)) for d, t in rows
        ]
        for k in ks:
            tvs = [float(tv) for d, t in pairs for tv in separate.law_tv(d, t, k)]
            out.append({"temperature": temperature, "k": k, "tv": sum(tvs) / len(tvs)})
    return out


def tuned(results: list[dict], *, temperature: float = 1.0, slack: float = 0.02) -> dict | None:
    """The SQS codec with the fewest bits whose rejection probability per position at
    `temperature` is within `slack` of dense's (the issue's target: <= 2 points more
    resampling than dense)."""
    at = [r for r in results if r["temperature"] == temperature]
    dense = next(r for r in at if r["label"] == "dense")
    limit = dense["rejection_per_position"] + slack
    ok = [r for r in at if r["label"] != "dense" and r["rejection_per_position"] <= limit]
    return min(ok, key=lambda r: r["bits_per_draft"]) if ok else None
