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
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import new_figure, save_json, save_png
from tandem.errors import TandemError

METHODS = ("lc", "rag", "sd", "streaming", "rapid-exact", "rapid-paper")
ETAS = (0.0, 5.0, 10.0, 20.0, 30.0, 50.0)


class AuditedRule:
    """RAPID's acceptance rule (`Augmented`) that also records, at every drafted position, how far the laws are apart:
    TV(paper-mode output law, p), TV(paper-mode output law, p_hat) and TV(p_hat, p), computed
    exactly (`tandem.sampling.rapid.output_law`) on the real q and z of the run."""

    def __init__(self, inner):
        self.inner = inner
        self.tv_paper_p: list[float] = []
        self.tv_paper_p_hat: list[float] = []
        self.tv_p_hat_p: list[float] = []

    def laws(self, target_probs, draft_probs):
        """The inner rule's laws; the distances are recorded on the side (the target's law
        enters as log-probabilities at temperature 1, as the rule itself reads it)."""
        from tandem.sampling import rapid

        r, gamma = self.inner, target_probs.shape[0] - 1
        draft = draft_probs[:gamma].double()  # [gamma, vocab]
        target = target_probs[:gamma].double()  # [gamma, vocab]
        logits = target.log()
        augmented = rapid.augmented_target(
            logits, draft, r.eta, 1.0, tail=r.tail, tail_ratio=r.tail_ratio
        )
        paper = rapid.output_law(
            draft, logits, r.eta, 1.0, mode="paper", tail=r.tail, tail_ratio=r.tail_ratio
        )
        for store, a, b in (
            (self.tv_paper_p, paper, target),
            (self.tv_paper_p_hat, paper, augmented),
            (self.tv_p_hat_p, augmented, target),
        ):
            store.extend((0.5 * (a - b).abs().sum(dim=-1)).tolist())
        return r.laws(target_probs, draft_probs)

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


@dataclass
class Prepared:
    """One task's prompts, prefilled once and shared by every method and seed: the long
    context for the target, C^S for RAG (`rag_target`) and for the drafter; the models
    that hold them (`short_lm`: the target model's instance for short prompts)."""

    task: Any
    retrieved: Any
    target: Any
    rag_target: Any
    drafter: Any
    target_lm: Any
    drafter_lm: Any
    short_lm: Any


def _prepare(
    task, target_lm, drafter_lm, embedder, retrieval, prefix=None, short_lm=None
) -> Prepared:
    """`short_lm`: the target model's instance for short prompts (C^S), if it has its own
    (kept as given in the record: None means the target's own instance)."""
    from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
    from tandem.protocols.rapid.retrieval import retrieve
    from tandem.protocols.rapid.states import Prefilled

    short = short_lm or target_lm
    retrieved = retrieve(task.context, task.question, target_lm.tokenizer, embedder, retrieval)
    ids = target_prompt(target_lm.tokenizer, task.context, task.question)
    target = Prefilled(target_lm, ids, prefix=prefix)
    rag_ids = drafter_prompt(target_lm.tokenizer, retrieved.text, task.question)
    rag_target = Prefilled(short, rag_ids)
    drafter = rag_target if drafter_lm is short else Prefilled(drafter_lm, rag_ids)
    return Prepared(task, retrieved, target, rag_target, drafter, target_lm, drafter_lm, short_lm)


def _moved(state, source, dest, folder: Path):
    """`state` of `source` as a state of `dest` (another instance of the same model), through
    the backends' KV files."""
    path = folder / "moved.kv"
    source.save_state(state, path)
    try:
        return dest.load_state(path)
    finally:
        path.unlink(missing_ok=True)


def _plus(result, seconds: float):
    """The result with `seconds` (the retrieval time) added to its prefill time."""
    result.prefill_s += seconds
    return result


def run_task(
    task,
    target_lm,
    drafter_lm,
    embedder,
    retrieval,
    config,
    *,
    window: int,
    eta: float,
    prefix=None,
    methods: tuple[str, ...] = METHODS,
    short_lm=None,
    seeds: tuple[int, ...] = (0,),
):
    """The `methods` on one task, once per seed (the prompts are prepared once); returns rows
    and the prepared prompts (for the sweep). `prefix`: the shared long context's prefill (the
    task's prompt continues it). `short_lm`: the target model's own instance for the short
    prompts (module doc of `run`)."""
    prepared = _prepare(task, target_lm, drafter_lm, embedder, retrieval, prefix, short_lm)
    retrieved, target = prepared.retrieved, prepared.target
    needle_hit = any(task.needle in c.text for c in retrieved.chunks)
    common = {
        "retrieved_tokens": retrieved.tokens,
        "retrieve_s": retrieved.retrieve_s,
        "needle_retrieved": needle_hit,
        "tail_prefill_s": target.tail_s,
    }
    rows = []
    for seed in seeds:
        rows += _run_methods(
            prepared, replace(config, seed=seed), methods, window=window, eta=eta,
            common={**common, "seed": seed},
        )  # fmt: skip
    return rows, (retrieved, target, prepared.drafter)


def _run_methods(
    prepared: Prepared, config, methods, *, window: int, eta: float, common: dict[str, Any]
) -> list[dict[str, Any]]:
    from tandem.baselines.rapid_baselines import lc, sd, streaming_sd
    from tandem.protocols.rapid.engine import rapid

    task, target, rag_target, drafter = (
        prepared.task, prepared.target, prepared.rag_target, prepared.drafter
    )  # fmt: skip
    target_lm, drafter_lm, short_lm = prepared.target_lm, prepared.drafter_lm, prepared.short_lm
    retrieve_s = prepared.retrieved.retrieve_s

    rows = []
    if "lc" in methods:
        rows.append(_row("lc", task, lc(target, config), **common))
    if "rag" in methods:
        rows.append(_row("rag", task, _plus(lc(rag_target, config), retrieve_s), **common))
    if "sd" in methods:
        rows.append(_row("sd", task, _plus(sd(target, drafter, config), retrieve_s), **common))
    if "streaming" in methods:
        if drafter_lm is target_lm:  # MagicDec self-speculation: the drafter views the target's KV
            long_state = target.copy()
        elif short_lm is not None and drafter_lm is short_lm:  # the same, in the drafter's cache
            import tempfile

            with tempfile.TemporaryDirectory() as folder:  # compressed there, by the drafter
                long_state = _moved(target.fresh(), target_lm, short_lm, Path(folder))
        else:
            from tandem.protocols.rapid.states import Prefilled

            long_state = Prefilled(drafter_lm, target.ids).copy()
        streaming = streaming_sd(target, drafter_lm, long_state, config, window=window)
        rows.append(_row("streaming", task, streaming, **common))
        del long_state
    for mode in ("exact", "paper"):
        if f"rapid-{mode}" in methods:
            result = rapid(target, drafter, replace(config, mode=mode, eta=eta))
            rows.append(_row(f"rapid-{mode}", task, _plus(result, retrieve_s), **common, eta=eta))
    return rows


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


LONG_OUTPUT_KINDS = ("quote", "code")  # answers long enough to time decoding


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
                "tasks": len({r["task"] for r in members}),
                "samples": len(members),  # tasks x seeds
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


def sign_test_p(better: int, worse: int) -> float:
    """Two-sided exact sign test: the probability, with ties dropped and each untied task
    equally likely to go either way, of a split at least as uneven as better : worse."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_quality(
    rows: list[dict[str, Any]], group: str, reference: str = "lc"
) -> dict[tuple, dict[str, Any]]:
    """Per (group value, method): each task's quality minus the `reference` method's (LC, or
    RAG for the upward target) on the same task and seed, averaged over the seeds (the task is
    the unit: its seeds are not independent tasks). Counts of tasks better / worse / tied, the
    mean difference with a 95% interval (normal approximation over tasks) and the sign test's
    p-value: whether "quality >= the reference's" can be told apart from noise here."""
    ref = {
        (r[group], r["task"], r.get("seed", 0)): r["quality"]
        for r in rows
        if r["method"] == reference
    }
    per_task: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        key = (r[group], r["task"], r.get("seed", 0))
        if r["method"] != reference and key in ref:
            tasks = per_task.setdefault((r[group], r["method"]), {})
            tasks.setdefault(r["task"], []).append(r["quality"] - ref[key])
    out = {}
    for key, by_task in per_task.items():
        ds = [statistics.mean(d) for d in by_task.values()]
        better, worse = sum(d > 1e-9 for d in ds), sum(d < -1e-9 for d in ds)
        mean = statistics.mean(ds)
        half = 1.96 * statistics.stdev(ds) / math.sqrt(len(ds)) if len(ds) > 1 else None
        out[key] = {
            "tasks": len(ds),
            "better": better,
            "worse": worse,
            "tied": len(ds) - better - worse,
            "mean_delta": mean,
            "ci95": None if half is None else [mean - half, mean + half],  # None: one task
            "sign_test_p": sign_test_p(better, worse),
        }
    return out


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


class MemoEmbedder:
    """An embedder that remembers: the pieces of a context that every task shares are embedded
    once (the first task's retrieval time holds it; later tasks embed their question only)."""

    def __init__(self, inner):
        self.inner, self.known = inner, {}
        self.name, self.dim = inner.name, inner.dim

    def embed(self, texts: list[str]):
        import numpy as np

        new = [t for t in dict.fromkeys(texts) if t not in self.known]
        if new:
            self.known.update(zip(new, self.inner.embed(new), strict=True))
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.known[t] for t in texts])


def step_costs(prefilled, *, gamma: int, repeats: int = 5) -> dict[str, float]:
    """Median milliseconds of one decode step and of one (gamma + 1)-token block on the
    prefilled prompt (the state is cut back after each): the per-step costs of the cost model."""
    import time

    lm, tokens = prefilled.lm, prefilled.ids[-(gamma + 1) :]
    decode, block = [], []
    for _ in range(repeats):
        state = prefilled.fresh()
        t0 = time.perf_counter()
        lm.decode(state, [tokens[:1]])
        t1 = time.perf_counter()
        prefilled.fresh()
        lm.decode(state, [tokens])
        t2 = time.perf_counter()
        decode.append(t1 - t0)
        block.append(t2 - t1)
    prefilled.fresh()
    return {
        "decode_ms": 1e3 * statistics.median(decode),
        "block_ms": 1e3 * statistics.median(block),
        "tokens": len(prefilled.ids),
    }


def tokens_per_round(acceptance: float, gamma: int) -> float:
    """Expected tokens a round emits when each draft passes with probability `acceptance`
    independently: 1 + a + ... + a^gamma (the planner's Eq. 5 with the bonus token)."""
    from tandem.protocols.spec.planner import expected_length

    return expected_length(acceptance, gamma, bonus=True)


def cost_model(costs: dict[int, dict], summary: list[dict], *, gamma: int) -> dict[str, Any]:
    """Predicted speedup of RAPID over LC at each context from the measured per-step costs:
    LC pays t_lc(L) per token; a RAPID round pays gamma drafter steps t_d (short context) and
    one block verification t_v(L) and emits E(a) tokens, so speedup = t_lc(L) E(a) /
    (gamma t_d + t_v(L)); E(a) assumes i.i.d. acceptance, so each context also gets the same
    prediction with the tokens per round the run measured (`*_measured_rounds`). The crossover context solves speedup = 1 with t_lc and t_v fitted
    linearly in L over the measured contexts and `a` the pooled acceptance; the measured
    crossover interpolates the measured speedups (linear in L) where they cross 1."""
    import numpy as np

    exact = {s["context"]: s for s in summary if s["method"] == "rapid-exact"}
    contexts = sorted(c for c in costs if c in exact and exact[c].get("speedup") is not None)
    if not contexts:
        return {}
    per_context = []
    for c in contexts:
        a = exact[c]["acceptance"] or 0.0
        e = tokens_per_round(a, gamma)
        t_d, t_v, t_lc = costs[c]["draft_ms"], costs[c]["block_ms"], costs[c]["decode_ms"]
        predicted = t_lc * e / (gamma * t_d + t_v)
        row = {
            "context": c, "acceptance": a, "tokens_per_round_model": e, "t_lc_ms": t_lc,
            "t_draft_ms": t_d, "t_verify_ms": t_v, "predicted_speedup": predicted,
            "measured_speedup": exact[c]["speedup"],
            "error": predicted / exact[c]["speedup"] - 1.0,
        }  # fmt: skip
        measured_e = exact[c].get("tokens_per_round")
        if measured_e:  # acceptance is not i.i.d.: the same model with the rounds' real yield
            row["tokens_per_round_measured"] = measured_e
            row["predicted_speedup_measured_rounds"] = t_lc * measured_e / (gamma * t_d + t_v)
            row["error_measured_rounds"] = (
                row["predicted_speedup_measured_rounds"] / exact[c]["speedup"] - 1.0
            )
        per_context.append(row)
    model: dict[str, Any] = {"per_context": per_context, "crossover_predicted": None,
                             "crossover_measured": None}  # fmt: skip
    if len(contexts) >= 2:
        xs = np.array(contexts, dtype=float)
        c1, c0 = np.polyfit(xs, [costs[c]["decode_ms"] for c in contexts], 1)
        v1, v0 = np.polyfit(xs, [costs[c]["block_ms"] for c in contexts], 1)
        drafted = sum(exact[c]["acceptance"] or 0.0 for c in contexts) / len(contexts)
        e = tokens_per_round(drafted, gamma)
        t_d = statistics.mean(costs[c]["draft_ms"] for c in contexts)
        slope = c1 * e - v1
        model["fit"] = {"t_lc_ms": [c0, c1], "t_verify_ms": [v0, v1], "t_draft_ms": t_d,
                        "acceptance": drafted}  # fmt: skip
        if slope > 0:
            model["crossover_predicted"] = float((gamma * t_d + v0 - c0 * e) / slope)
        points = [(c, exact[c]["speedup"]) for c in contexts]
        for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
            if (y0 - 1.0) * (y1 - 1.0) <= 0 and y0 != y1:
                model["crossover_measured"] = float(x0 + (1.0 - y0) * (x1 - x0) / (y1 - y0))
                break
        if model["crossover_measured"] is None:
            model["crossover_measured_bound"] = (
                f"< {contexts[0]}" if points[0][1] > 1.0 else f"> {contexts[-1]}"
            )
        pred, meas = model["crossover_predicted"], model["crossover_measured"]
        if pred is not None and meas:
            model["crossover_error"] = pred / meas - 1.0
    return model


def shared_prefix(tokenizer, tasks) -> list[int]:
    """The token prefix every task's target prompt shares (the long context): prefilled once
    per context length and continued by each question."""
    from tandem.protocols.rapid.prompts import target_prompt

    return _common_prefix([target_prompt(tokenizer, t.context, t.question) for t in tasks])


def _common_prefix(rows: list[list[int]]) -> list[int]:
    import os.path

    return list(os.path.commonprefix(rows))


DEFAULT_KV_CACHE = Path("~/.cache/tandem/kv/rapid")


def run(
    *,
    out: Path = RESULTS,
    quick: bool = False,
    contexts: list[int] | None = None,
    tasks_per_kind: int | None = None,
    sweep_context: int | None = None,
    sweep_tasks: int | None = None,
    seeds: int = 1,
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
    threads: int | None = None,
    name: str | None = None,
    backend: str | None = None,
    methods: tuple[str, ...] = METHODS,
    kv_type: str = "f16",
    kv_cache: Path | None = DEFAULT_KV_CACHE,
    cpus: list[int] | None = None,
    embedder: str | None = None,
) -> dict:
    """Run the benchmark; see the module doc. `quick` finishes in a few minutes. `seeds`:
    every method runs each task with seeds 0 .. seeds - 1 (samples differ only where the
    temperature is above 0); quality is the mean over tasks and seeds.

    Every task of one context length asks about the same long context (tasks.py,
    `build_shared_tasks`): it is prefilled once (or loaded from `kv_cache`, a folder of KV
    files; None: always prefill) and each question continues that KV. The process runs on
    `cpus` (default: every core) with the engine's threads = their number (`threads`
    overrides).

    On llama.cpp the short prompts (C^S: the RAG baseline, the self-speculating drafter, the
    StreamingLLM drafter's compressed cache) run in a second instance of the target model
    with a KV cache of their own: in one unified cache every row's attention spans the cells
    up to the highest one in use, so a 700-token drafter row beside a 16K context paid for
    16K cells (measured: 87 ms per drafted token at 16K vs 40 ms at 4K). The weights are
    mapped once by the OS page cache; the instances share nothing else."""
    import torch

    from tandem.models.registry import check_backend, load_model
    from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
    from tandem.protocols.rapid.states import Prefilled
    from tandem.protocols.rapid.tasks import build_shared_tasks
    from tandem.retrieval.embedder import load_embedder
    from tandem.testbed.cpus import available, machine_state, pin

    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise TandemError(f"methods must be among {', '.join(METHODS)} (got {', '.join(methods)})")
    if "lc" not in methods:
        raise TandemError("the lc method is the reference of every ratio: keep it")
    if seeds < 1:
        raise TandemError(f"seeds must be at least 1 (got {seeds})")
    contexts = contexts or ([1024] if quick else [1024, 2048, 4096])
    tasks_per_kind = tasks_per_kind or (1 if quick else 2)
    sweep_context = sweep_context or contexts[0]
    sweep_tasks = sweep_tasks if sweep_tasks is not None else (1 if quick else 3)
    etas = etas or ((0.0, 10.0, 50.0) if quick else ETAS)
    sweep_modes = ("exact",) if quick else ("exact", "paper")
    max_new_tokens = max_new_tokens or (32 if quick else 64)
    name = name or ("rapid_upward" if upward else "rapid")
    backend = check_backend(backend)
    kv_cache = kv_cache.expanduser() if kv_cache is not None else None
    config = RapidConfig(
        gamma=gamma, eta=eta, temperature=temperature, max_new_tokens=max_new_tokens, seed=0
    )
    retrieval = RetrievalConfig(chunk_tokens=chunk_tokens, min_tokens=min_tokens)
    if embedder:
        retrieval = replace(retrieval, embedder=embedder)
    threads_before = torch.get_num_threads()
    affinity_before = available()
    cores = pin(cpus if cpus else affinity_before)
    threads = threads or len(cores)
    torch.set_num_threads(threads)
    engine = (
        {"n_ctx": max(contexts) + 16384, "threads": threads, "kv_type": kv_type}
        if backend == "llamacpp"
        else {}
    )
    console = Console(width=max(Console().width, 180))
    machine: dict[str, Any] = {"before": machine_state()}
    costs: dict[int, dict] = {}
    prefills: dict[int, dict] = {}
    try:
        target_lm = load_model(model, progress=False, backend=backend, **engine)
        short_lm = None
        if backend == "llamacpp":  # short prompts in a cache of their own (see the doc above)
            short_n_ctx = (max(contexts) if "streaming" in methods else 0) + 16384
            short_lm = load_model(
                model, progress=False, backend=backend, **{**engine, "n_ctx": short_n_ctx}
            )
        drafter_lm = (
            load_model(upward, progress=False, backend=backend, **engine)
            if upward
            else short_lm or target_lm
        )
        embed = load_embedder(retrieval.embedder)
        for lm in {id(x): x for x in (target_lm, drafter_lm, short_lm) if x}.values():
            _warm_up(lm)
        rows, sweep_rows = [], []
        with Progress(console=console, transient=True) as progress:
            for length in contexts:
                tasks = build_shared_tasks(
                    target_lm.tokenizer, context_tokens=length, num_tasks=tasks_per_kind
                )
                memo = MemoEmbedder(embed)
                shared = shared_prefix(target_lm.tokenizer, tasks)
                console.log(f"context {length}: {len(tasks)} tasks, prefix {len(shared)} tokens")
                prefix = Prefilled.cached(target_lm, shared, kv_cache)
                prefills[length] = {"tokens": len(shared), "prefill_s": prefix.prefill_s,
                                    "loaded_from_cache": prefix.loaded,
                                    "load_s": prefix.load_s}  # fmt: skip
                costs[length] = step_costs(prefix, gamma=gamma)
                bar = progress.add_task(f"context {length}", total=len(tasks))
                sweeping = length == sweep_context and sweep_tasks
                prepared = []  # the prompts' states stay alive only for the sweep (KV cells)
                for task in tasks:
                    task_rows, prep = run_task(
                        task, target_lm, drafter_lm, memo, retrieval, config, window=window,
                        eta=eta, prefix=prefix, methods=methods, short_lm=short_lm,
                        seeds=tuple(range(seeds)),
                    )  # fmt: skip
                    rows.extend(task_rows)
                    if task is tasks[0]:  # the RAG drafter's step, on a C^S-long prompt
                        draft_costs = step_costs(prep[2], gamma=gamma)
                        costs[length]["draft_ms"] = draft_costs["decode_ms"]
                        costs[length]["draft_tokens"] = draft_costs["tokens"]
                    prepared.append((task, prep if sweeping else (prep[0], None, None)))
                    del prep
                    progress.advance(bar)
                if sweeping:
                    step = max(1, len(prepared) // sweep_tasks)  # from the end: long answers
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
                del prepared, prefix
                gc.collect()
        machine["after"] = machine_state(target_lm)
    finally:
        pin(affinity_before)
        torch.set_num_threads(threads_before)

    for row in rows:
        row["context"] = _bucket(row["context_tokens"], contexts)
    summary = aggregate(rows, ("context", "method"))
    add_ratios(summary, "context")
    for reference in ("lc", "rag"):  # quality_vs_rag: the upward target's other half
        paired = paired_quality(rows, "context", reference)
        for s in summary:
            if (s["context"], s["method"]) in paired:
                s[f"quality_vs_{reference}"] = paired[s["context"], s["method"]]
    model_fit = cost_model(costs, summary, gamma=gamma) if "rapid-exact" in methods else {}
    sweep = aggregate(sweep_rows, ("retrieval", "method", "eta")) if sweep_rows else []
    swept = {r["task"] for r in sweep_rows}  # compare with LC on the same (swept) tasks
    lc_swept = aggregate(  # the sweep runs with config.seed
        [
            r
            for r in rows
            if r["method"] == "lc" and r["task"] in swept and r["seed"] == config.seed
        ],
        ("method",),
    )
    for s in sweep:
        s["delta_quality"] = s["quality"] - lc_swept[0]["quality"]
        s["speedup"] = s["tokens_per_s"] / lc_swept[0]["tokens_per_s"]
    payload = {
        "benchmark": name,
        "settings": {
            "model": model, "drafter": upward or model, "contexts": contexts,
            "tasks_per_kind": tasks_per_kind, "seeds": seeds, "gamma": gamma, "eta": eta,
            "temperature": temperature, "max_new_tokens": max_new_tokens,
            "chunk_tokens": chunk_tokens, "min_tokens": min_tokens, "compression": retrieval.compression,
            "threshold": retrieval.threshold, "embedder": retrieval.embedder, "streaming_window": window, "streaming_sink": 4,
            "backend": backend, "threads": threads, "cpus": cores, "kv_type": kv_type,
            "methods": list(methods), "shared_context": True,
            "kv_cache": str(kv_cache) if kv_cache else None,
            "sweep_context": sweep_context, "sweep_etas": list(etas),
            "sweep_modes": list(sweep_modes), "quick": quick,
        },
        "machine": machine,
        "prefill": prefills,
        "step_costs": costs,
        "cost_model": model_fit,
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
    save_json(out, name, payload)
    _plot(summary, sweep, contexts, out, name)
    _print(console, summary, sweep, prefills, model_fit)
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
        dodge = 0.012 * (index - (len(methods) - 1) / 2)  # methods side by side at a context
        pts = [(c * (1 + dodge), s) for c, s in pts]
        axes[0][0].plot([c for c, _ in pts], [s["quality"] for _, s in pts], **style)
        paired = [(c, s) for c, s in pts if (s.get("quality_vs_lc") or {}).get("ci95")]
        if paired:  # LC's quality + the 95% interval of the paired difference
            lc_quality = {s["context"]: s["quality"] for s in summary if s["method"] == "lc"}
            mid = [s["quality"] for _, s in paired]
            lo = [lc_quality[s["context"]] + s["quality_vs_lc"]["ci95"][0] for _, s in paired]
            hi = [lc_quality[s["context"]] + s["quality_vs_lc"]["ci95"][1] for _, s in paired]
            axes[0][0].errorbar(
                [c for c, _ in paired], mid, color=f"C{index}", fmt="none", capsize=3,
                yerr=[[max(0.0, q - a) for q, a in zip(mid, lo, strict=True)],
                      [max(0.0, b - q) for q, b in zip(mid, hi, strict=True)]],
            )  # fmt: skip
        axes[0][1].plot(xs, [s.get("speedup", 0) for _, s in pts], **style)
        if m not in ("lc", "rag"):
            axes[0][2].plot(xs, [s["acceptance"] or 0 for _, s in pts], **style)
    axes[0][1].axhline(1.0, color="k", lw=0.8, ls=":")
    axes[0][0].set(
        xlabel="context tokens",
        ylabel="quality (task metric)",
        title="quality (bars: LC + 95% interval of the paired difference)",
    )
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


def _print(console: Console, summary, sweep, prefills=None, model_fit=None) -> None:
    table = Table("context", "method", "tasks", "quality", "Δ vs LC", "tasks +/-/= (p)",
                  "tok/s", "speedup", "speedup (all)", "e2e speedup", "acceptance", "tok/round",
                  title="RAPID vs baselines (speedup: decode throughput / LC's, quote tasks)")  # fmt: skip
    for s in sorted(summary, key=lambda s: (s["context"], METHODS.index(s["method"]))):
        q = s.get("quality_vs_lc")
        split = f"{q['better']}/{q['worse']}/{q['tied']} ({q['sign_test_p']:.2f})" if q else "-"
        table.add_row(
            str(s["context"]), s["method"], str(s["tasks"]), _fmt(s["quality"], ".3f"),
            _fmt(s.get("delta_quality"), "+.3f"), split, _fmt(s["tokens_per_s"], ".2f"),
            _fmt(s.get("speedup"), ".2f"), _fmt(s.get("speedup_all"), ".2f"),
            _fmt(s.get("e2e_speedup"), ".2f"), _fmt(s["acceptance"], ".2f"),
            _fmt(s["tokens_per_round"], ".2f"),
        )  # fmt: skip
    console.print(table)
    if prefills:
        table = Table("context", "prefix tokens", "prefill s", "from KV file (load s)",
                      "t_lc ms", "t_verify ms", "t_draft ms", "predicted", "measured",
                      title="shared-context prefill and the cost model (RAPID exact vs LC)")  # fmt: skip
        fits = {r["context"]: r for r in (model_fit or {}).get("per_context", [])}
        for length, info in prefills.items():
            fit = fits.get(length, {})
            table.add_row(
                str(length), str(info["tokens"]), f"{info['prefill_s']:.1f}",
                f"yes ({info['load_s']:.1f})" if info["loaded_from_cache"] else "no",
                _fmt(fit.get("t_lc_ms"), ".1f"), _fmt(fit.get("t_verify_ms"), ".1f"),
                _fmt(fit.get("t_draft_ms"), ".1f"), _fmt(fit.get("predicted_speedup"), ".2f"),
                _fmt(fit.get("measured_speedup"), ".2f"),
            )  # fmt: skip
        console.print(table)
        if model_fit and "fit" in model_fit:
            console.print(
                f"crossover context: predicted {_fmt(model_fit['crossover_predicted'], '.0f')}, "
                f"measured {_fmt(model_fit['crossover_measured'], '.0f')}"
                f" {model_fit.get('crossover_measured_bound', '')}"
            )
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
