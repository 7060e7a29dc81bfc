"""`tandem bench rapid`: RAPID vs LC, RAG, SD and a StreamingLLM drafter on the offline
long-context task set (paper Table 1, Fig. 3 and Table 3 analogues, on a CPU).

For each context length, each task (tandem.protocols.rapid.tasks) is prefilled once per prompt
and every method starts from those prefills (`Prefilled.fresh`), so methods are measured side
by side on identical inputs, seeds and machine state. Methods:
  lc        target (0.5B) on the long context
  rag       target on the retrieved context C^S
  sd        RAG drafter + plain verification against the target law p
  streaming SD with a StreamingLLM drafter (sink 4 + recent window, MagicDec-style)
  rapid-exact / rapid-paper   RAG drafter + retrieval-augmented target (eta), both modes
Self-speculation: the drafter is the target model. `upward=<model>` drafts with a larger model.
Quality: the task's metric (exact match or ROUGE-L, see tasks.py). Speedup: the paper's, the
ratio of decode throughputs (tokens / decoding time) to LC's; the end-to-end ratio (prefill +
decode) is reported too. Acceptance: accepted / drafted tokens. Warm-up: one short untimed
generation per model before any measurement. The eta sweep (Table 3 analogue) runs RAPID at the
sweep context with relevant retrieval and with *unrelated* retrieval (another task's C^S).
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tandem.bench.report import new_figure, save_json, save_png

METHODS = ("lc", "rag", "sd", "streaming", "rapid-exact", "rapid-paper")
ETAS = (0.0, 5.0, 10.0, 20.0, 30.0, 50.0)


class AuditedRule:
    """A RapidRule that also records, at every drafted position, how far the laws are apart:
    TV(paper-mode output law, p), TV(paper-mode output law, p_hat) and TV(p_hat, p), computed
    exactly (`tandem.sampling.rapid.output_law`) on the real q and z of the run."""

    def __init__(self, inner):
        self.inner = inner
        self.tv_paper_p: list[float] = []
        self.tv_paper_p_hat: list[float] = []
        self.tv_p_hat_p: list[float] = []

    def __call__(self, draft_tokens, draft_probs, target_logits, generator):
        from tandem.sampling import rapid
        from tandem.sampling.warp import warp

        r, gamma = self.inner, draft_tokens.shape[0]
        draft = draft_probs[:gamma].double()  # [gamma, vocab]
        logits = target_logits[:gamma].double()  # [gamma, vocab]
        target = warp(logits, temperature=r.temperature)
        augmented = rapid.augmented_target(
            logits, draft, r.eta, r.temperature, tail=r.tail, tail_ratio=r.tail_ratio
        )
        paper = rapid.output_law(
            draft, logits, r.eta, r.temperature, mode="paper", tail=r.tail, tail_ratio=r.tail_ratio
        )
        for store, a, b in (
            (self.tv_paper_p, paper, target),
            (self.tv_paper_p_hat, paper, augmented),
            (self.tv_p_hat_p, augmented, target),
        ):
            store.extend((0.5 * (a - b).abs().sum(dim=-1)).tolist())
        return r(draft_tokens, draft_probs, target_logits, generator)

    def summary(self) -> dict[str, float]:
        mean = statistics.mean
        return {
            "tv_paper_p": mean(self.tv_paper_p) if self.tv_paper_p else 0.0,
            "tv_paper_p_hat": mean(self.tv_paper_p_hat) if self.tv_paper_p_hat else 0.0,
            "tv_p_hat_p": mean(self.tv_p_hat_p) if self.tv_p_hat_p else 0.0,
            "audited_positions": len(self.tv_paper_p),
        }


def _row(method: str, task, result, **extra: Any) -> dict[str, Any]:
    return {
        "method": method,
        "task": task.task_id,
        "kind": task.kind,
        "context_tokens": task.context_tokens,
        "quality": task.score(result.text),
        "tokens": len(result.tokens),
        "prefill_s": result.prefill_s,
        "decode_s": result.decode_s,
        "drafted": result.drafted,
        "accepted": result.accepted,
        "rounds": result.rounds,
        "draft_s": result.draft_s,
        "verify_s": result.verify_s,
        "text": result.text,
        **extra,
    }


def _prepare(task, target_lm, drafter_lm, embedder, retrieval):
    from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
    from tandem.protocols.rapid.retrieval import retrieve
    from tandem.protocols.rapid.states import Prefilled

    retrieved = retrieve(task.context, task.question, target_lm.tokenizer, embedder, retrieval)
    target = Prefilled(target_lm, target_prompt(target_lm.tokenizer, task.context, task.question))
    rag_ids = drafter_prompt(target_lm.tokenizer, retrieved.text, task.question)
    rag_target = Prefilled(target_lm, rag_ids)
    drafter = rag_target if drafter_lm is target_lm else Prefilled(drafter_lm, rag_ids)
    return retrieved, target, rag_target, drafter


def _plus(result, seconds: float):
    """The result with `seconds` (the retrieval time) added to its prefill time."""
    result.prefill_s += seconds
    return result


def run_task(task, target_lm, drafter_lm, embedder, retrieval, config, *, window: int, eta: float):
    """Every method on one task; returns rows and the prepared prompts (for the sweep)."""
    from tandem.baselines.rapid_baselines import lc, sd, streaming_sd
    from tandem.protocols.rapid.engine import rapid

    retrieved, target, rag_target, drafter = _prepare(
        task, target_lm, drafter_lm, embedder, retrieval
    )
    needle_hit = any(task.needle in c.text for c in retrieved.chunks)
    common = {
        "retrieved_tokens": retrieved.tokens,
        "retrieve_s": retrieved.retrieve_s,
        "needle_retrieved": needle_hit,
    }
    retrieve_s = retrieved.retrieve_s
    rows = [
        _row("lc", task, lc(target, config), **common),
        _row("rag", task, _plus(lc(rag_target, config), retrieve_s), **common),
        _row("sd", task, _plus(sd(target, drafter, config), retrieve_s), **common),
    ]
    if drafter_lm is target_lm:  # MagicDec self-speculation: the drafter views the target's KV
        long_state = target.copy()
    else:
        from tandem.protocols.rapid.states import Prefilled

        long_state = Prefilled(drafter_lm, target.ids).copy()
    streaming = streaming_sd(target, drafter_lm, long_state, config, window=window)
    rows.append(_row("streaming", task, streaming, **common))
    del long_state
    for mode in ("exact", "paper"):
        result = rapid(target, drafter, replace(config, mode=mode, eta=eta))
        rows.append(_row(f"rapid-{mode}", task, _plus(result, retrieve_s), **common, eta=eta))
    return rows, (retrieved, target, drafter)


def sweep_task(task, prepared, unrelated_text, drafter_lm, config, etas, modes):
    from tandem.protocols.rapid.engine import make_rule, rapid
    from tandem.protocols.rapid.prompts import drafter_prompt
    from tandem.protocols.rapid.states import Prefilled

    _, target, drafter = prepared
    unrelated = Prefilled(
        drafter_lm, drafter_prompt(drafter_lm.tokenizer, unrelated_text, task.question)
    )
    rows = []
    for retrieval_kind, drafter_side in (("relevant", drafter), ("unrelated", unrelated)):
        for mode in modes:
            for eta in etas:
                tuned = replace(config, mode=mode, eta=eta)
                audit = AuditedRule(make_rule(tuned)) if tuned.temperature > 0 else None
                result = rapid(target, drafter_side, tuned, rule=audit)
                laws = audit.summary() if audit else {}
                rows.append(
                    _row(f"rapid-{mode}", task, result, eta=eta, retrieval=retrieval_kind, **laws)
                )
    return rows


LONG_OUTPUT_KINDS = ("quote",)  # tasks whose answers are long enough to time decoding


def _throughput(members: list[dict]) -> float:
    return sum(r["tokens"] for r in members) / max(1e-9, sum(r["decode_s"] for r in members))


def aggregate(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per group: mean quality (all tasks); decode throughput (sum tokens / sum decode time)
    over the long-output tasks (`LONG_OUTPUT_KINDS`, as the paper times long CoT outputs) and
    over all tasks; acceptance = accepted / drafted; mean end-to-end latency."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    out = []
    for key, members in groups.items():
        long = [r for r in members if r["kind"] in LONG_OUTPUT_KINDS] or members
        drafted = sum(r["drafted"] for r in members)
        tv = [r for r in members if "tv_paper_p" in r]
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "tasks": len(members),
                "quality": statistics.mean(r["quality"] for r in members),
                "tokens_per_s": _throughput(long),
                "tokens_per_s_all": _throughput(members),
                "e2e_s": statistics.mean(r["prefill_s"] + r["decode_s"] for r in members),
                "acceptance": sum(r["accepted"] for r in members) / drafted if drafted else None,
                "tokens_per_round": sum(r["tokens"] for r in members)
                / max(1, sum(r["rounds"] for r in members)),
                **({k: statistics.mean(r[k] for r in tv) for k in TV_KEYS} if tv else {}),
            }
        )
    return out


TV_KEYS = ("tv_paper_p", "tv_paper_p_hat", "tv_p_hat_p")


def add_ratios(summary: list[dict[str, Any]], group: str) -> None:
    """speedup = decode throughput / LC's (long-output tasks; `speedup_all`: all tasks);
    e2e_speedup = LC's mean end-to-end latency / this one's; delta_quality = quality - LC's."""
    base = {s[group]: s for s in summary if s["method"] == "lc"}
    for s in summary:
        lc_row = base.get(s[group])
        if lc_row:
            s["speedup"] = s["tokens_per_s"] / lc_row["tokens_per_s"]
            s["speedup_all"] = s["tokens_per_s_all"] / lc_row["tokens_per_s_all"]
            s["e2e_speedup"] = lc_row["e2e_s"] / s["e2e_s"]
            s["delta_quality"] = s["quality"] - lc_row["quality"]


def _warm_up(lm) -> None:
    state = lm.prefill(lm.tokenizer.encode("def warm_up(x):\n    return x"))
    for token in (13, 14, 15):
        lm.decode(state, [token])


def run(
    *,
    out: Path = Path("bench/results"),
    quick: bool = False,
    contexts: list[int] | None = None,
    tasks_per_kind: int | None = None,
    sweep_context: int | None = None,
    sweep_tasks: int | None = None,
    etas: tuple[float, ...] | None = None,
    eta: float = 10.0,
    gamma: int = 5,
    temperature: float = 0.1,
    max_new_tokens: int | None = None,
    chunk_tokens: int = 256,
    min_tokens: int = 512,
    window: int = 256,
    model: str = "qwen2.5-coder-0.5b",
    upward: str | None = None,
    threads: int = 1,
    name: str | None = None,
) -> dict:
    """Run the benchmark; see the module doc. `quick` finishes in a few minutes."""
    import torch

    from tandem.models.registry import load_model
    from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
    from tandem.protocols.rapid.tasks import build_tasks
    from tandem.retrieval.embedder import load_embedder

    contexts = contexts or ([1024] if quick else [1024, 2048, 4096])
    tasks_per_kind = tasks_per_kind or (1 if quick else 2)
    sweep_context = sweep_context or contexts[0]
    sweep_tasks = sweep_tasks if sweep_tasks is not None else (1 if quick else 3)
    etas = etas or ((0.0, 10.0, 50.0) if quick else ETAS)
    sweep_modes = ("exact",) if quick else ("exact", "paper")
    max_new_tokens = max_new_tokens or (32 if quick else 64)
    name = name or ("rapid_upward" if upward else "rapid")
    config = RapidConfig(
        gamma=gamma, eta=eta, temperature=temperature, max_new_tokens=max_new_tokens, seed=0
    )
    retrieval = RetrievalConfig(chunk_tokens=chunk_tokens, min_tokens=min_tokens)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    console = Console(width=max(Console().width, 180))
    try:
        target_lm = load_model(model, progress=False)
        drafter_lm = load_model(upward, progress=False) if upward else target_lm
        embedder = load_embedder(retrieval.embedder)
        for lm in {id(target_lm): target_lm, id(drafter_lm): drafter_lm}.values():
            _warm_up(lm)
        rows, sweep_rows = [], []
        with Progress(console=console, transient=True) as progress:
            for length in contexts:
                tasks = build_tasks(
                    target_lm.tokenizer, context_tokens=length, num_tasks=tasks_per_kind
                )
                bar = progress.add_task(f"context {length}", total=len(tasks))
                prepared = []
                for task in tasks:
                    task_rows, prep = run_task(
                        task,
                        target_lm,
                        drafter_lm,
                        embedder,
                        retrieval,
                        config,
                        window=window,
                        eta=eta,
                    )
                    rows.extend(task_rows)
                    prepared.append((task, prep))
                    progress.advance(bar)
                if length == sweep_context and sweep_tasks:
                    step = max(1, len(prepared) // sweep_tasks)  # from the end: quote first
                    chosen = list(range(len(prepared) - 1, -1, -step))[:sweep_tasks]
                    sbar = progress.add_task("eta sweep", total=len(chosen))
                    for index in chosen:
                        task, prep = prepared[index]
                        # unrelated retrieval: the next task's C^S (paper: one sample's for all)
                        unrelated = prepared[(index + 1) % len(prepared)][1][0].text
                        sweep_rows.extend(
                            sweep_task(task, prep, unrelated, drafter_lm, config, etas, sweep_modes)
                        )
                        progress.advance(sbar)
                del prepared
                gc.collect()
    finally:
        torch.set_num_threads(threads_before)

    for row in rows:
        row["context"] = _bucket(row["context_tokens"], contexts)
    summary = aggregate(rows, ("context", "method"))
    add_ratios(summary, "context")
    sweep = aggregate(sweep_rows, ("retrieval", "method", "eta")) if sweep_rows else []
    swept = {r["task"] for r in sweep_rows}  # compare with LC on the same (swept) tasks
    lc_swept = aggregate(
        [r for r in rows if r["method"] == "lc" and r["task"] in swept], ("method",)
    )
    for s in sweep:
        s["delta_quality"] = s["quality"] - lc_swept[0]["quality"]
        s["speedup"] = s["tokens_per_s"] / lc_swept[0]["tokens_per_s"]
    payload = {
        "benchmark": name,
        "settings": {
            "model": model, "drafter": upward or model, "contexts": contexts,
            "tasks_per_kind": tasks_per_kind, "gamma": gamma, "eta": eta,
            "temperature": temperature, "max_new_tokens": max_new_tokens,
            "chunk_tokens": chunk_tokens, "min_tokens": min_tokens, "compression": retrieval.compression,
            "threshold": retrieval.threshold, "streaming_window": window, "streaming_sink": 4,
            "torch_threads": threads, "sweep_context": sweep_context, "sweep_etas": list(etas),
            "sweep_modes": list(sweep_modes), "quick": quick,
        },
        "summary": summary,
        "sweep": sweep,
        "lc_on_swept_tasks": lc_swept,
        "rows": rows,
        "sweep_rows": sweep_rows,
        "paper": {
            "table1_llama8b_self": {"LC": 1.00, "RAG": 3.35, "SD": 1.63, "MagicDec": 0.71, "RAPID": 2.10},
            "context": "120K tokens, A800 GPU; speedup = decode throughput ratio to LC",
        },
    }  # fmt: skip
    json_path = save_json(out, name, payload)
    png_path = _plot(summary, sweep, contexts, out, name)
    _print(console, summary, sweep)
    console.print(f"saved {json_path} and {png_path}")
    return payload


def _bucket(tokens: int, contexts: list[int]) -> int:
    return min(contexts, key=lambda c: abs(c - tokens))


def _plot(summary, sweep, contexts, out: Path, name: str) -> Path:
    fig, axes = new_figure(ncols=3, nrows=2, size=(5.0, 3.6))
    methods = [m for m in METHODS if any(s["method"] == m for s in summary)]
    for index, m in enumerate(methods):
        pts = sorted(((s["context"], s) for s in summary if s["method"] == m), key=lambda p: p[0])
        xs = [c for c, _ in pts]
        style = {"label": m, "color": f"C{index}", "marker": "o"}
        axes[0][0].plot(xs, [s["quality"] for _, s in pts], **style)
        axes[0][1].plot(xs, [s.get("speedup", 0) for _, s in pts], **style)
        if m not in ("lc", "rag"):
            axes[0][2].plot(xs, [s["acceptance"] or 0 for _, s in pts], **style)
    axes[0][1].axhline(1.0, color="k", lw=0.8, ls=":")
    axes[0][0].set(xlabel="context tokens", ylabel="quality (task metric)", title="quality")
    axes[0][1].set(xlabel="context tokens", ylabel="decode throughput / LC", title="speedup vs LC")
    axes[0][2].set(xlabel="context tokens", ylabel="accepted / drafted", title="acceptance rate")
    for kind, style in (("relevant", "o-"), ("unrelated", "s--")):
        for mode in ("exact", "paper"):
            pts = sorted(
                (s["eta"], s)
                for s in sweep
                if s["retrieval"] == kind and s["method"] == f"rapid-{mode}"
            )
            if not pts:
                continue
            xs = [e for e, _ in pts]
            label = f"{mode}, {kind}"
            axes[1][0].plot(xs, [s["delta_quality"] or 0 for _, s in pts], style, label=label)
            axes[1][1].plot(xs, [s["speedup"] or 0 for _, s in pts], style, label=label)
            axes[1][2].plot(xs, [s["acceptance"] or 0 for _, s in pts], style, label=label)
    axes[1][0].set(xlabel="eta", ylabel="quality - LC", title="eta sweep: quality gain")
    axes[1][1].set(xlabel="eta", ylabel="decode throughput / LC", title="eta sweep: speedup")
    axes[1][2].set(xlabel="eta", ylabel="accepted / drafted", title="eta sweep: acceptance")
    for row in axes:
        for ax in row:
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    return save_png(fig, out, name)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print(console: Console, summary, sweep) -> None:
    table = Table("context", "method", "tasks", "quality", "Δ vs LC", "tok/s", "speedup",
                  "speedup (all)", "e2e speedup", "acceptance", "tok/round",
                  title="RAPID vs baselines (speedup: decode throughput / LC's, quote tasks)")  # fmt: skip
    for s in sorted(summary, key=lambda s: (s["context"], METHODS.index(s["method"]))):
        table.add_row(
            str(s["context"]), s["method"], str(s["tasks"]), _fmt(s["quality"], ".3f"),
            _fmt(s.get("delta_quality"), "+.3f"), _fmt(s["tokens_per_s"], ".2f"),
            _fmt(s.get("speedup"), ".2f"), _fmt(s.get("speedup_all"), ".2f"),
            _fmt(s.get("e2e_speedup"), ".2f"), _fmt(s["acceptance"], ".2f"),
            _fmt(s["tokens_per_round"], ".2f"),
        )  # fmt: skip
    console.print(table)
    if sweep:
        table = Table("retrieval", "mode", "eta", "quality", "Δ vs LC", "speedup", "acceptance",
                      "TV(paper law, p)", "TV(paper law, p_hat)", "TV(p_hat, p)",
                      title="eta sweep (Table 3 analogue)")  # fmt: skip
        for s in sorted(sweep, key=lambda s: (s["retrieval"], s["method"], s["eta"])):
            table.add_row(
                s["retrieval"], s["method"], f"{s['eta']:g}", _fmt(s["quality"], ".3f"),
                _fmt(s["delta_quality"], "+.3f"), _fmt(s["speedup"], ".2f"),
                _fmt(s["acceptance"], ".2f"), _fmt(s.get("tv_paper_p"), ".3f"),
                _fmt(s.get("tv_paper_p_hat"), ".3f"), _fmt(s.get("tv_p_hat_p"), ".3f"),
            )  # fmt: skip
        console.print(table)
