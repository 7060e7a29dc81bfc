"""`tandem bench humaneval-traces`: the real pair's teacher-forced acceptance on HumanEval.

For each problem the target (default Qwen2.5-Coder-1.5B, llama.cpp) decodes `n` tokens
greedily from the raw prompt, one token per step as the cloud's AR stream does (stopping early
only at EOS); then the draft model (default the 0.5B) reads prompt + those tokens in one
teacher-forced pass. Per output position the file records

- `draft_agreement_teacher_forced`: 1 where the draft's greedy token equals the target's (the
  key `tandem bench spec-paper --traces` replays; the same measure as `tandem bench
  humaneval`'s, on every problem instead of the ones a run generated);
- `draft_rank`: the target token's rank in the draft's logits (0 = the draft's own choice,
  1 = its second choice, ...);
- `draft_top_prob`: the draft's top-1 probability (softmax of its logits, temperature 1).

Nothing here is timed: both models use every core this process may run on, one after the
other. `summary` pools the positions (agreement; where the models disagree, how often the
target's token is the draft's 2nd / top-3 / top-5 choice; the draft's confidence where they
agree and where they do not) and counts problems per agreement band; the PNG shows the
problems' agreement histogram.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from benchmarks import RESULTS
from benchmarks import humaneval_tasks as tasks
from benchmarks.report import Machines, new_figure, save_json, save_png
from tandem.protocols.decoding import decode_steps
from tandem.testbed import cpus

BANDS = ((0.0, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0))


def target_greedy(lm, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens of `lm` after `ids` from the one decoding loop, one decode step each
    (as cloud AR runs it), ending after EOS."""
    steps = decode_steps(lm, lm.prefill(ids), seed=0, temperature=0.0, max_new_tokens=n,
                         eos=lm.tokenizer.eos_token_id)  # fmt: skip
    return list(steps)


def teacher_forced(lm, ids: list[int], tokens: list[int]) -> dict[str, list]:
    """The draft's view of the target's tokens: agreement, the target token's rank, top-1 prob."""
    state = lm.prefill(ids)
    rows = [state.logits[0]]
    if len(tokens) > 1:
        rows.extend(lm.decode(state, tokens[:-1])[0])
    logits = torch.stack(rows).float()  # [len(tokens), vocab]
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    rank = (logits > chosen[:, None]).sum(-1)
    top = torch.softmax(logits, -1).max(-1).values
    return {
        "agree": [int(a == t) for a, t in zip(logits.argmax(-1).tolist(), tokens, strict=True)],
        "rank": rank.tolist(),
        "top_prob": [round(float(p), 4) for p in top],
    }


def summarize(records: dict[str, dict]) -> dict:
    agree = [a for r in records.values() for a in r["agree"]]
    rank = [k for r in records.values() for k in r["rank"]]
    top = [p for r in records.values() for p in r["top_prob"]]
    missed = [k for a, k in zip(agree, rank, strict=True) if not a]
    per_problem = {task: statistics.fmean(r["agree"]) for task, r in records.items()}
    bands = {
        f"[{lo:.1f}, {hi:.1f}{']' if hi == 1.0 else ')'}": sorted(
            (t for t, a in per_problem.items() if lo <= a < hi or (hi == 1.0 and a == 1.0)),
            key=lambda t: int(t.split("/")[-1]),
        )
        for lo, hi in BANDS
    }
    return {
        "problems": len(records),
        "positions": len(agree),
        "agreement": statistics.fmean(agree) if agree else None,
        "disagreements": len(missed),
        "target_is_draft_second_choice": sum(k == 1 for k in missed) / max(1, len(missed)),
        "target_in_draft_top3": sum(k < 3 for k in missed) / max(1, len(missed)),
        "target_in_draft_top5": sum(k < 5 for k in missed) / max(1, len(missed)),
        "draft_top_prob_mean_where_agree": _mean([p for a, p in zip(agree, top, strict=True) if a]),
        "draft_top_prob_mean_where_disagree": _mean(
            [p for a, p in zip(agree, top, strict=True) if not a]
        ),
        "per_problem_agreement": per_problem,
        "problems_per_band": {band: len(tasks_) for band, tasks_ in bands.items()},
        "bands": bands,
    }


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def run(
    *,
    problems: str = "all",
    max_new_tokens: int = 128,
    device_model: str = "qwen2.5-coder-0.5b",
    cloud_model: str = "qwen2.5-coder-1.5b",
    name: str = "humaneval_traces",
    out: Path = RESULTS,
) -> dict:
    from tandem.models.registry import load_model

    console = Console()
    dataset = tasks.load_problems()
    chosen = [dataset[i] for i in tasks.parse_selection(problems, len(dataset))]
    machines = Machines(
        cpus={"both models, one after the other": cpus.available()},
        isolation="none needed: nothing is timed",
    )
    started = time.perf_counter()
    target = load_model(cloud_model, progress=False)
    outputs: dict[str, list[int]] = {}
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"{cloud_model}: greedy outputs", total=len(chosen))
        for problem in chosen:
            ids = target.tokenizer.encode(problem["prompt"])
            outputs[problem["task_id"]] = target_greedy(target, ids, max_new_tokens)
            progress.advance(bar)
        del target
        draft = load_model(device_model, progress=False)
        records: dict[str, dict] = {}
        bar = progress.add_task(f"{device_model}: teacher forced", total=len(chosen))
        for problem in chosen:
            ids = draft.tokenizer.encode(problem["prompt"])
            records[problem["task_id"]] = teacher_forced(draft, ids, outputs[problem["task_id"]])
            progress.advance(bar)
    summary = summarize(records)
    payload = {
        "benchmark": "humaneval-traces",
        "setup": {
            "problems": [p["task_id"] for p in chosen],
            "max_new_tokens": max_new_tokens,
            "device_model": device_model,
            "cloud_model": cloud_model,
            "target_output": "greedy, one decode step per token (the cloud's AR stream), "
            "stops early only at EOS; the raw prompt, no chat template",
            "draft_view": "one teacher-forced pass over prompt + the target's tokens",
            "wall_s": time.perf_counter() - started,
        },
        "summary": summary,
        "target_tokens": outputs,
        "draft_agreement_teacher_forced": {t: r["agree"] for t, r in records.items()},
        "draft_rank": {t: r["rank"] for t, r in records.items()},
        "draft_top_prob": {t: r["top_prob"] for t, r in records.items()},
    }
    save_json(out, name, payload, machines=machines)
    _plot(out, name, summary)
    console.print(
        f"{summary['problems']} problems, {summary['positions']} positions: agreement "
        f"{summary['agreement']:.3f}; where they disagree the target's token is the draft's "
        f"2nd choice {summary['target_is_draft_second_choice']:.0%} of the time"
    )
    for band, count in summary["problems_per_band"].items():
        console.print(f"  agreement {band}: {count} problems")
    return payload


def _plot(out: Path, name: str, summary: dict) -> None:
    fig, grid = new_figure(size=(6.0, 3.5))
    ax = grid[0][0]
    ax.hist(list(summary["per_problem_agreement"].values()), bins=20, range=(0.5, 1.0))
    ax.set_xlabel("teacher-forced agreement per problem (draft top-1 == target greedy)")
    ax.set_ylabel("problems")
    ax.set_title(f"HumanEval, {summary['problems']} problems (real pair, llama.cpp)")
    save_png(fig, out, name)
