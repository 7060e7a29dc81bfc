"""`tandem bench spec-paper`: every exact method side by side on PicoSpec's hardware,
EMULATED, driven by the acceptance measured on HumanEval (issue 15, item 3, emulated part).

Words used here:
- *emulated*: both models are `SleepLM`s (tandem.models.emulated): forward passes sleep
  for the calibrated times below, logits are a deterministic hash of the context. Nothing
  here measures a real model; every table and the JSON say "emulated".
- *calibration* (PicoSpec Tables 1-2, Jetson-class edge + A100 cloud): a draft step 24 ms
  per token; a target pass over n new tokens 67 + 5 n ms, so one AR step is 72 ms (13.89
  tokens/s) and verifying a 4-token block 87 ms; prefill 120 ms (target), 40 ms (draft).
- *trace*: per output position, whether the draft model's greedy token equals the target's
  on the target's own prefix. "humaneval": `draft_agreement_teacher_forced` of
  benchmarks/results/humaneval.json (Qwen2.5-Coder 0.5B vs 1.5B, llama.cpp, one list of 128 per
  problem), or of any file given with `--traces` (`tandem bench humaneval-traces` records all
  164 problems); with `--band LO-HI` only the problems whose own agreement lies in [LO, HI]
  ("humaneval-LO-HI": real traces at that agreement, disagreements where the real pair has
  them, clustered or not); "random-0.7" / "random-0.75" / "random-0.8": the sweep, random
  traces with exactly that agreement, independent of each other (`exact_draw`). The draft's
  row at position t is the target's row, with the target's top token pushed below all others
  where the trace says "disagree" (so no branch ever holds it). *Ranked* traces (`--ranked`,
  a humaneval-traces file) also keep, per position, the rank of the target's token in the real
  draft's order and the draft's top probability: "humaneval" with its own, "ranked-0.8" etc.
  with exactly that agreement and each position's (rank, top) drawn from the real pair's
  positions with the same outcome (`ranked_draw`); the draft's row (`RankedTraceDraftLM`) puts
  the target's token at that rank and gives its top token that probability;
  decoding is greedy, so every method's output is the target's greedy path and each draft is
  accepted exactly where the trace agrees.
- methods: cloud AR (tokens streamed), stop-and-wait (sync, separate rejection), PicoSpec
  (async, fast verification, separate rejection), eager ("the cloud never idles", dense
  uplink: the toy vocabulary has 64 tokens), eager-branch (eager with branches on the draft's
  second choice where its top probability is below 0.5, 4 drafts each) and adaptive (planner.Controller: picks the
  method and draft length per generation from its estimates, and inside an eager generation
  the draft length and whether to draft each round, and whether to branch (eager-branch's
  settings; `Controller.branches_pay`, the epoch model at its estimates, priced beside each
  generation); it starts from the calibrated costs, the link's RTT, alpha 0.8 and
  planner.BRANCHING_PRIOR, and learns them as it runs, also from the other methods' runs on
  the same trace). Device-only decoding is not exact and is left out. Draft length 4 for the
  fixed methods, which run without the controller.
- throughput = tokens / total time (TTFT included); decode = (tokens - 1) / time after the
  first token. `predicted` = planner.throughput (Eq. 7, Eq. 9, Eq. 9 extended) at the trace's
  mean agreement and the calibrated costs, compared with the measured decode rate;
  `predicted_epoch` = the epoch model (tandem.protocols.spec.epochs: the pipelines' own
  rules, i.i.d. acceptance) for PicoSpec, eager and eager-branch (`epochs.branch_rate`, with
  the trace's `branching`: how often its drafts are unsure where they match and where they
  do not, and how often the target's token is then the draft's second choice,
  `trace_branching`); eager-branch's `predicted` is eager's (the closed form has no
  branches).

One process: device and cloud sessions over `memory_pair` with the in-process link emulator
(delay RTT/2 each way, 100 Mbit/s); sleeping needs no cores, so the machine's load matters
little (the load average is in the JSON). One warm-up generation per RTT, discarded.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import Machines, new_figure, save_json, save_png
from benchmarks.spec import PROMPTS
from tandem.errors import TandemError
from tandem.models.emulated import SleepLM
from tandem.protocols.spec import SpecConfig, epochs, run_pair
from tandem.protocols.spec.planner import Branching, Controller, Costs, throughput
from tandem.transport import LinkConfig, memory_pair
from tandem.transport import loop as event_loop

DRAFT_TOKEN_S, TARGET_BASE_S, TARGET_PER_TOKEN_S = 0.024, 0.067, 0.005
DRAFT_PER_TOKEN_S = 0.002  # a draft pass over n tokens: DRAFT_TOKEN_S + (n - 1) of these
METHODS = ("cloud-ar", "stop-and-wait", "picospec", "eager", "eager-branch", "adaptive")
SETTINGS = {
    "stop-and-wait": {"pipeline": "sync", "codec": "separate"},
    "picospec": {"pipeline": "async", "codec": "separate", "fast_verify": True},
    "eager": {"pipeline": "eager", "codec": "dense"},
    "eager-branch": {"pipeline": "eager", "codec": "dense", "branch_below": 0.5, "branch_len": 4},
}
MODEL_OF = {
    "cloud-ar": "ar",
    "stop-and-wait": "sync",
    "picospec": "async",
    "eager": "eager",
    "eager-branch": "eager",  # the closed forms do not price branches (the epoch model does)
}
GAMMA = 4


def calibrated_costs(rtt_s: float) -> Costs:
    return Costs(
        t_draft=DRAFT_TOKEN_S,
        decode_base=TARGET_BASE_S,
        decode_per_token=TARGET_PER_TOKEN_S,
        rtt=rtt_s,
    )


class TraceDraftLM(SleepLM):
    """The draft: the target's row, its top token demoted where the trace disagrees."""

    def __init__(self, target: SleepLM, trace: list, prompt_len: int) -> None:
        super().__init__(
            f"{type(self).__name__}-{id(trace)}",
            vocab_size=target.vocab_size,
            base_s=DRAFT_TOKEN_S - DRAFT_PER_TOKEN_S,
            per_token_s=DRAFT_PER_TOKEN_S,
            prefill_s=0.040,
        )
        self.target, self.trace, self.prompt_len = target, trace, prompt_len

    def at(self, context: tuple[int, ...]):
        """The trace's entry for the position `context` predicts."""
        return self.trace[(len(context) - self.prompt_len) % len(self.trace)]

    def row(self, context: tuple[int, ...]) -> torch.Tensor:  # [vocab]
        row = self.target.row(context).clone()
        if not self.at(context):
            row[row.argmax()] = row.min() - 1.0
        return row


class RankedTraceDraftLM(TraceDraftLM):
    """The draft from a *ranked* trace: per position (agree, rank, top): the draft orders the
    vocabulary as the target does, except that where it disagrees the target's top token
    sits at `rank` (1: the draft's second choice); its own top token gets probability `top`
    (the rest decreasing). Greedy drafts are its top token; a branch takes its second."""

    def row(self, context: tuple[int, ...]) -> torch.Tensor:  # [vocab]
        agree, rank, top = self.at(context)
        order = self.target.row(context).argsort(descending=True).tolist()
        if not agree:
            order.insert(min(max(1, rank), len(order) - 1), order.pop(0))
        vocab = len(order)
        second = min(0.9 * top, 0.6 * (1.0 - top))
        rest = (1.0 - top - second) / (vocab - 2)
        probs = [top, second] + [rest * (1.0 + 1e-3 * (vocab / 2 - k)) for k in range(vocab - 2)]
        row = torch.empty(vocab)
        row[torch.tensor(order)] = torch.tensor(probs).clamp_min(1e-12).log()
        return row


def ranked_pools(path: Path) -> dict[int, list[tuple[int, float]]]:
    """The real pair's positions in `path` (humaneval-traces): agree (1) / disagree (0) ->
    [(rank of the target's token in the draft's order, the draft's top probability)]."""
    pools: dict[int, list[tuple[int, float]]] = {0: [], 1: []}
    for trace in recorded_traces(path, ranked=True).values():
        for agree, rank, top in trace:
            pools[agree].append((int(rank), float(top)))
    return pools


def ranked_draw(
    p: float, pools: dict[int, list[tuple[int, float]]], generator: torch.Generator
) -> list[tuple[int, int, float]]:
    """`exact_draw(p)`'s agreement, each position's (rank, top) drawn from the real pair's
    positions with the same outcome."""
    out = []
    for agree in exact_draw(p, generator):
        pool = pools[agree]
        rank, top = pool[int(torch.randint(len(pool), (1,), generator=generator))]
        out.append((agree, rank, top))
    return out


def paper_target() -> SleepLM:
    return SleepLM(
        "emulated-a100-target",
        base_s=TARGET_BASE_S,
        per_token_s=TARGET_PER_TOKEN_S,
        prefill_s=0.120,
    )


def load_traces(
    path: Path,
    sweep: tuple[float, ...],
    sweep_problems: int,
    band: tuple[float, float] | None = None,
) -> dict:
    """trace name -> list of agreement lists (module docstring)."""
    return build_traces(recorded_traces(path, band), sweep, sweep_problems, band)


def build_traces(
    recorded: dict[str, list],
    sweep: tuple[float, ...],
    sweep_problems: int,
    band: tuple[float, float] | None,
    pools: dict[int, list[tuple[int, float]]] | None = None,
) -> dict:
    """The recorded traces (`recorded_traces`) under their name, then the sweep: random
    traces, or with `pools` (`ranked_pools`) ranked ones ("ranked-p", `ranked_draw`)."""
    traces: dict[str, list[list]] = {}
    if recorded:
        traces[humaneval_trace_name(band)] = list(recorded.values())
    generator = torch.Generator().manual_seed(15)
    for p in sweep:
        if pools is None:
            traces[f"random-{p:g}"] = [exact_draw(p, generator) for _ in range(sweep_problems)]
        else:
            traces[f"ranked-{p:g}"] = [
                ranked_draw(p, pools, generator) for _ in range(sweep_problems)
            ]
    return traces


def recorded_traces(
    path: Path,
    band: tuple[float, float] | None = None,
    problems: int | None = None,
    ranked: bool = False,
) -> dict[str, list]:
    """problem -> agreement list recorded in `path` (in its order), those in `band` if given,
    the first `problems` of them if given; `ranked`: (agree, rank, top) per position instead
    (a humaneval-traces file: `draft_rank`, `draft_top_prob`)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    recorded = data.get("draft_agreement_teacher_forced", {})
    traces: dict[str, list] = {task: list(map(int, v)) for task, v in recorded.items() if v}
    if band is not None:
        traces = {t: a for t, a in traces.items() if band[0] <= sum(a) / len(a) <= band[1]}
    traces = dict(list(traces.items())[:problems]) if problems is not None else traces
    if ranked:
        if "draft_rank" not in data or "draft_top_prob" not in data:
            raise TandemError(
                f"--ranked needs draft_rank and draft_top_prob in {path}: record them with "
                "tandem bench humaneval-traces"
            )
        traces = {
            t: list(zip(a, data["draft_rank"][t], data["draft_top_prob"][t], strict=True))
            for t, a in traces.items()
        }
    return traces


def is_ranked(trace: list) -> bool:
    """Whether a trace is ranked ((agree, rank, top) per position) or agreement only."""
    return bool(trace) and isinstance(trace[0], tuple)


def trace_draft(target: SleepLM, trace: list, prompt_len: int) -> SleepLM:
    """The draft for a trace: ranked (tuples per position) or agreement only."""
    if is_ranked(trace):
        return RankedTraceDraftLM(target, trace, prompt_len)
    return TraceDraftLM(target, trace, prompt_len)


def _shown(path: Path) -> str:
    """The path as the command line would give it from the repository root, where it can."""
    try:
        return str(path.resolve().relative_to(RESULTS.resolve().parent.parent))
    except ValueError:
        return str(path)


def humaneval_trace_name(band: tuple[float, float] | None) -> str:
    return "humaneval" if band is None else f"humaneval-{band[0]:g}-{band[1]:g}"


def parse_band(text: str | None) -> tuple[float, float] | None:
    """'0.7-0.8' -> (0.7, 0.8); None -> None."""
    if not text:
        return None
    try:
        lo, hi = (float(x) for x in text.split("-"))
    except ValueError:
        raise TandemError(f"--band {text!r}: give two agreements as LO-HI, e.g. 0.7-0.8") from None
    if not 0.0 <= lo <= hi <= 1.0:
        raise TandemError(f"--band {text!r}: need 0 <= LO <= HI <= 1")
    return lo, hi


def exact_draw(p: float, generator: torch.Generator, length: int = 128) -> list[int]:
    """`length` positions, exactly round(p * length) of them agreeing, at random places: every
    position agrees with probability p and every trace's agreement is p itself (independent
    draws of 2 x 128 had given 0.83 for p = 0.8)."""
    agree = torch.zeros(length, dtype=torch.int)
    agree[torch.randperm(length, generator=generator)[: round(p * length)]] = 1
    return agree.tolist()


async def run_one(method, *, target, draft, prompt_ids, rtt_ms, n, controller=None):
    """One generation; returns (report, the plan's method and gamma for adaptive)."""
    from tandem.baselines.spec_baselines import run_cloud_ar, serve_cloud_ar

    link = LinkConfig(delay_ms=rtt_ms / 2, rate_mbit=100.0)
    base = {"temperature": 0.0, "max_new_tokens": n, "stop_at_eos": False, "draft_len": GAMMA}
    chosen, gamma = method, GAMMA
    if method == "adaptive":
        plan = controller.plan()
        chosen = next(k for k, v in MODEL_OF.items() if v == plan.method)
        gamma = plan.gamma or GAMMA
    if chosen == "cloud-ar":
        device_channel, cloud_channel = memory_pair(link=link)
        cloud = asyncio.create_task(serve_cloud_ar(cloud_channel, target))
        report = await run_cloud_ar(
            device_channel, target.tokenizer, prompt_ids, SpecConfig(**base)
        )
        await asyncio.wait_for(cloud, 60)
        await cloud_channel.close()
        return report, (chosen, 0)
    # adaptive eager: branches on the draft's second choice where the controller says they pay
    # (before 2026-11-28 the fixed "eager" also ran with the controller, re-planning its
    # draft length each round: 3 or 6 instead of 4 at RTT 200)
    adaptive_eager = method == "adaptive" and chosen == "eager"
    settings = SETTINGS["eager-branch" if adaptive_eager else chosen]
    config = SpecConfig(**{**base, **settings, "draft_len": gamma})
    eager_controller = controller if adaptive_eager else None
    report, _ = await run_pair(
        device_lm=draft, cloud_lm=target, prompt_ids=prompt_ids, config=config, link=link,
        controller=eager_controller,
    )  # fmt: skip
    if controller is not None and eager_controller is None:  # learn from the other pipelines
        summary = report.summary()
        accepted = sum(v.num_accepted for v in report.verdicts)
        controller.observe_drafts(accepted, sum(v.rejected for v in report.verdicts))
        if summary["t_draft_token_ms"]:
            controller.observe_draft(summary["t_draft_token_ms"] / 1e3)
        if "confidence" in report.branches:
            controller.observe_confidence(**report.branches["confidence"])
    return report, (chosen, gamma)


def record(report) -> dict:
    s = report.summary()
    ttft = s["ttft_ms"] / 1e3
    return {
        "tokens": s["tokens"],
        "total_s": report.total_s,
        "decode_s": report.total_s - ttft,
        "ttft_ms": s["ttft_ms"],
        "acceptance_rate": s["acceptance_rate"],
        "ar_tokens": report.cloud.get("ar_tokens", 0),
        **({"branches": report.branches} if report.branches else {}),
        "tokens_list": report.tokens,
    }


def run(
    *,
    out: Path = RESULTS,
    humaneval: Path = RESULTS / "humaneval.json",
    rtts: tuple[float, ...] = (100.0, 200.0),
    sweep: tuple[float, ...] = (0.7, 0.75, 0.8),
    problems: int | None = None,
    sweep_problems: int = 4,
    max_new_tokens: int = 128,
    methods: tuple[str, ...] = METHODS,
    name: str = "spec_paper",
    band: tuple[float, float] | None = None,
    ranked: bool = False,
) -> dict:
    """Run every method at every RTT on every trace; save `name`.json / .png; print tables.
    `ranked`: the traces carry the real pair's ranks (`humaneval` must be a humaneval-traces
    file): recorded ones their own, the sweep's resampled from them."""
    from tandem.testbed.cpus import role_cpus

    console = Console()
    machines = Machines(
        cpus=role_cpus(),
        isolation="one process; emulated compute sleeps (SleepLM), no model runs on a core",
        shared=["event loop, sampling, codecs, link emulator"],
    )
    recorded = recorded_traces(humaneval, band, problems, ranked)  # the sweep keeps its count
    pools = ranked_pools(humaneval) if ranked else None
    traces = build_traces(recorded, sweep, sweep_problems, band, pools)
    if humaneval_trace_name(band) not in traces:
        console.print(f"[yellow]no acceptance traces in {humaneval}"
                      f"{f' with agreement in {band}' if band else ''}: agreement sweep only")  # fmt: skip
    target, n, started = paper_target(), max_new_tokens, time.perf_counter()
    runs: list[dict] = []
    total = sum(len(v) for v in traces.values()) * len(rtts) * len(methods)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("spec-paper (emulated)", total=total)
        for rtt in rtts:
            warm_ids = target.tokenizer.encode(PROMPTS[0])
            warm = TraceDraftLM(target, [1], len(warm_ids))
            event_loop.run(run_one("eager", target=target, draft=warm, prompt_ids=warm_ids,
                                rtt_ms=rtt, n=8))  # fmt: skip
            for trace_name, agreements in traces.items():
                controller = Controller(prior=calibrated_costs(rtt / 1e3), alpha=0.8)
                for index, agreement in enumerate(agreements):
                    ids = target.tokenizer.encode(PROMPTS[index % len(PROMPTS)])
                    draft = trace_draft(target, agreement, len(ids))
                    for method in methods:
                        report, (chosen, gamma) = event_loop.run(
                            run_one(method, target=target, draft=draft, prompt_ids=ids,
                                    rtt_ms=rtt, n=n, controller=controller)
                        )  # fmt: skip
                        runs.append({"trace": trace_name, "problem": index, "rtt_ms": rtt,
                                     "method": method, "chose": chosen, "gamma": gamma,
                                     **record(report)})  # fmt: skip
                        progress.advance(bar)
    table = summarize(runs, traces, rtts, methods)
    payload = {
        "emulated": True,
        "setup": {
            "what": "EMULATED: SleepLM pair with PicoSpec's hardware timings; no real model",
            "calibration": {"draft_ms_per_token": 1e3 * DRAFT_TOKEN_S,
                            "target_pass_ms": f"{1e3 * TARGET_BASE_S:g} + {1e3 * TARGET_PER_TOKEN_S:g} n",
                            "target_ar_tok_s": 1 / (TARGET_BASE_S + TARGET_PER_TOKEN_S),
                            "verify_4_ms": 1e3 * (TARGET_BASE_S + 4 * TARGET_PER_TOKEN_S)},
            "traces": {k: {"source": f"{_shown(humaneval)} draft_agreement_teacher_forced"
                           + (f", the problems with agreement in [{band[0]:g}, {band[1]:g}]" if band else "")
                           + (", with each position's draft_rank and draft_top_prob" if ranked else "")
                           if k == humaneval_trace_name(band) else
                           f"exactly round(p * 128) agreeing positions each (seed 15), each position's (rank, top prob) drawn from {_shown(humaneval)}'s positions with the same outcome"
                           if ranked else "random traces, exactly round(p * 128) agreeing positions each (seed 15)",
                           "problems": len(v), "mean_agreement": mean_agreement(v),
                           **({"tasks": list(recorded)[: len(v)]}
                              if k == humaneval_trace_name(band) else {})}
                       for k, v in traces.items()},
            "methods": {m: SETTINGS.get(m, m) for m in methods},
            "ranked": ranked,
            "draft_len": GAMMA,
            "max_new_tokens": n,
            "link": "in-process LinkConfig emulator, delay RTT/2 each way, 100 Mbit/s",
            "wall_s": time.perf_counter() - started,
        },
        "table": table,
        "runs": runs,
    }  # fmt: skip
    save_json(out, name, payload, machines=machines)
    _print(console, table)
    _plot(out, name, table, methods)
    return payload


def mean_agreement(agreements: list[list]) -> float:
    flat = [a[0] if isinstance(a, tuple) else a for seq in agreements for a in seq]
    return sum(flat) / len(flat)


def trace_branching(agreements: list[list], below: float, length: int) -> Branching:
    """What a trace's drafts do for branches at `branch_below` = `below` (planner.Branching).
    Ranked traces: from each position's (agree, rank, top). Agreement-only traces: the draft's
    row is the target's, its top token demoted where the trace disagrees, so the target's token
    is never the second choice; how often such rows are unsure is counted over 1024 of the
    target's rows (a hash of the context: rows at any contexts are alike)."""
    refeed = DRAFT_PER_TOKEN_S * length  # the first step after a taken branch feeds it
    if agreements and is_ranked(agreements[0]):
        flat = [a for seq in agreements for a in seq]
        match = [top < below for agree, _, top in flat if agree]
        miss = [(top < below, rank == 1) for agree, rank, top in flat if not agree]
        second = [is_second for unsure, is_second in miss if unsure]
        return Branching(
            unsure_match=sum(match) / max(1, len(match)),
            unsure_miss=sum(u for u, _ in miss) / max(1, len(miss)),
            second=sum(second) / max(1, len(second)),
            length=length,
            refeed_s=refeed,
        )
    match, miss = toy_unsure_rates(below)
    return Branching(match, miss, 0.0, length=length, refeed_s=refeed)


@functools.cache
def toy_unsure_rates(below: float, rows: int = 1024) -> tuple[float, float]:
    """How often an agreement-only draft's row is unsure (top probability below `below`) where
    it agrees (the target's row) and where it does not (its top token demoted), over `rows`
    of the toy target's rows; the same for every such trace, so computed once."""
    target, match, miss = paper_target(), 0, 0
    for k in range(rows):
        row = target.row((k,))
        match += float(torch.softmax(row.double(), dim=-1).max()) < below
        row[row.argmax()] = row.min() - 1.0
        miss += float(torch.softmax(row.double(), dim=-1).max()) < below
    return match / rows, miss / rows


def epoch_rate(method: str, agreements: list[list], alpha: float, gamma: int, rtt_ms: float):
    """The epoch model's decode rate for `method` on a trace; eager-branch also returns the
    trace's branching: (rate, branching or None)."""
    costs = calibrated_costs(rtt_ms / 1e3)
    if method != "eager-branch":
        return epochs.rate(MODEL_OF[method], alpha, gamma, costs), None
    settings = SETTINGS[method]
    branching = trace_branching(agreements, settings["branch_below"], settings["branch_len"])
    return epochs.branch_rate(alpha, gamma, costs, branching), branching


def summarize(runs, traces, rtts, methods) -> list[dict]:
    """One row per (trace, RTT, method): pooled rates, ratios, predicted vs measured."""
    rows = []
    for trace_name, agreements in traces.items():
        alpha = mean_agreement(agreements)
        for rtt in rtts:
            group = {}
            for method in methods:
                mine = [r for r in runs if (r["trace"], r["rtt_ms"], r["method"]) ==
                        (trace_name, rtt, method)]  # fmt: skip
                tokens = sum(r["tokens"] for r in mine)
                group[method] = {
                    "trace": trace_name, "rtt_ms": rtt, "method": method, "emulated": True,
                    "alpha_trace": alpha,
                    "throughput_tok_s": tokens / sum(r["total_s"] for r in mine),
                    "decode_tok_s": sum(r["tokens"] - 1 for r in mine)
                    / sum(r["decode_s"] for r in mine),
                    "acceptance_rate": sum(r["acceptance_rate"] for r in mine) / len(mine),
                    "ttft_ms": sum(r["ttft_ms"] for r in mine) / len(mine),
                    "ar_tokens": sum(r["ar_tokens"] for r in mine),
                    "chose": sorted({f"{r['chose']}/{r['gamma']}" for r in mine}),
                }  # fmt: skip
                model = MODEL_OF.get(method, "eager")
                gamma = GAMMA if method != "adaptive" else max(1, mine[-1]["gamma"])
                predicted = throughput(model, alpha, gamma, calibrated_costs(rtt / 1e3))
                group[method]["predicted_decode_tok_s"] = predicted
                group[method]["predicted_model"] = model
                if method in ("picospec", "eager", "eager-branch"):  # priced by their rules
                    epoch, branching = epoch_rate(method, agreements, alpha, gamma, rtt)
                    if branching is not None:
                        group[method]["branching"] = asdict(branching)
                    group[method]["predicted_epoch_decode_tok_s"] = epoch
                    group[method]["predicted_epoch_over_measured"] = (
                        epoch / group[method]["decode_tok_s"]
                    )
                group[method]["predicted_over_measured"] = predicted / group[method]["decode_tok_s"]
            for row in group.values():
                for ref, key in (("stop-and-wait", "speedup_vs_stop_and_wait"),
                                 ("cloud-ar", "speedup_vs_cloud_ar"),
                                 ("picospec", "speedup_vs_picospec"),
                                 ("eager", "speedup_vs_eager")):  # fmt: skip
                    if ref in group:
                        row[key] = row["throughput_tok_s"] / group[ref]["throughput_tok_s"]
                        row[f"decode_{key}"] = row["decode_tok_s"] / group[ref]["decode_tok_s"]
                best = max(r["throughput_tok_s"] for m, r in group.items() if m != "adaptive")
                row["over_best_fixed"] = row["throughput_tok_s"] / best
                rows.append(row)
    return rows


def _print(console, table) -> None:
    out = Table(title="EMULATED paper hardware, acceptance from traces (tok/s, TTFT included)")
    for col in ("trace", "RTT", "method", "tok/s", "decode", "predicted", "epoch model",
                "x s&w", "x AR", "x PicoSpec", "accept", "chose"):  # fmt: skip
        out.add_column(col, justify="left" if col in ("trace", "method", "chose") else "right")
    for r in table:
        out.add_row(
            r["trace"], f"{r['rtt_ms']:.0f}", r["method"], f"{r['throughput_tok_s']:.2f}",
            f"{r['decode_tok_s']:.2f}", f"{r['predicted_decode_tok_s']:.2f}",
            f"{r['predicted_epoch_decode_tok_s']:.2f}" if "predicted_epoch_decode_tok_s" in r
            else "-",
            f"{r.get('speedup_vs_stop_and_wait', 0):.2f}", f"{r.get('speedup_vs_cloud_ar', 0):.2f}",
            f"{r.get('speedup_vs_picospec', 0):.2f}", f"{r['acceptance_rate']:.2f}",
            ",".join(r["chose"]),
        )  # fmt: skip
    console.print(out)


def _plot(out, name, table, methods) -> None:
    groups = sorted({(r["trace"], r["rtt_ms"]) for r in table})
    fig, grid = new_figure(ncols=2, size=(7.0, 4.5))
    axes = grid[0]
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        values = [next(r["throughput_tok_s"] for r in table
                       if (r["trace"], r["rtt_ms"], r["method"]) == (*g, method)) for g in groups]  # fmt: skip
        axes[0].bar([x + i * width for x in range(len(groups))], values, width, label=method)
    axes[0].set_xticks([x + 0.4 - width / 2 for x in range(len(groups))],
                       [f"{t}\nRTT {r:.0f}" for t, r in groups], fontsize=7)  # fmt: skip
    axes[0].set(title="EMULATED: throughput (tok/s, TTFT incl.)", ylabel="tok/s")
    axes[0].legend(fontsize=7)
    measured = [r["decode_tok_s"] for r in table]
    predicted = [r["predicted_decode_tok_s"] for r in table]
    axes[1].scatter(measured, predicted, s=12, label="planner (Eq. 7 / 9 / extended)")
    epoch = [(r["decode_tok_s"], r["predicted_epoch_decode_tok_s"]) for r in table
             if "predicted_epoch_decode_tok_s" in r]  # fmt: skip
    if epoch:
        axes[1].scatter([m for m, _ in epoch], [e for _, e in epoch], s=12, marker="x",
                        label="epoch model")  # fmt: skip
        predicted = predicted + [e for _, e in epoch]
    top = max(measured + predicted) * 1.05
    axes[1].plot([0, top], [0, top], color="grey", linewidth=0.8)
    axes[1].plot([0, top], [0, 1.1 * top], color="grey", linestyle=":", linewidth=0.8)
    axes[1].plot([0, top], [0, 0.9 * top], color="grey", linestyle=":", linewidth=0.8)
    for r in table:
        axes[1].annotate(r["method"][:5], (r["decode_tok_s"], r["predicted_decode_tok_s"]),
                         fontsize=5)  # fmt: skip
    axes[1].set(title="predicted vs measured decode rate", xlabel="measured tok/s",
                ylabel="predicted tok/s")  # fmt: skip
    axes[1].legend(fontsize=6)
    save_png(fig, out, name)
