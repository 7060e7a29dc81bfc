"""What a long-context step costs under llama.cpp's attention and KV-cache switches: one decode
step and one (gamma + 1)-token verification block of the target, at each context length.

RAPID pays off when verifying a block costs little more than one step (docs/rapid.md). On this
CPU without flash attention a block's attention does (gamma + 1)x a step's work, so the block
cost grows with the context several times faster than a step's. This measures whether
llama.cpp's switches change that: `f16` (the default: f16 KV, no flash attention),
`f16+flash` (flash attention), `q8_0+flash` (8-bit KV, which needs flash attention).

The contexts are the RAPID bench's shared long contexts (`tasks.build_shared_tasks`, same
prefix tokens, same n_ctx), so f16 prefills load from its KV cache; each variant's prefill is
timed (or loaded) and reported apart. One process, pinned to `cpus`, engine threads = their number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "f16": {"kv_type": "f16"},
    "f16+flash": {"kv_type": "f16", "flash_attn": True},
    "q8_0+flash": {"kv_type": "q8_0"},
}


def run(
    *,
    out: Path,
    contexts: list[int],
    variants: list[str],
    model: str = "qwen2.5-coder-0.5b",
    gamma: int = 5,
    repeats: int = 7,
    tasks_per_kind: int = 4,
    kv_cache: Path | None = None,
    cpus: list[int] | None = None,
    name: str = "rapid_steps",
) -> dict:
    from rich.console import Console

    from benchmarks.rapid import shared_prefix, step_costs
    from benchmarks.report import save_json
    from tandem.errors import TandemError
    from tandem.models.registry import load_model
    from tandem.protocols.rapid.states import Prefilled
    from tandem.protocols.rapid.tasks import build_shared_tasks
    from tandem.testbed.cpus import available, machine_state, pin

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        raise TandemError(f"variants must be among {', '.join(VARIANTS)} (got {unknown})")
    console = Console()
    cores = pin(cpus if cpus else available())
    kv_cache = kv_cache.expanduser() if kv_cache is not None else None
    before = machine_state()
    rows = []
    for variant in variants:
        lm = load_model(
            model, progress=False, backend="llamacpp", n_ctx=max(contexts) + 16384,
            threads=len(cores), **VARIANTS[variant],
        )  # fmt: skip
        for length in contexts:
            tasks = build_shared_tasks(
                lm.tokenizer, context_tokens=length, num_tasks=tasks_per_kind
            )
            prefix = Prefilled.cached(lm, shared_prefix(lm.tokenizer, tasks), kv_cache)
            costs = step_costs(prefix, gamma=gamma, repeats=repeats)
            row = {"variant": variant, "context": length, **costs,
                   "prefill_s": prefix.prefill_s, "loaded_from_cache": prefix.loaded,
                   "loadavg": machine_state()["loadavg"]}  # fmt: skip
            row["block_over_step"] = row["block_ms"] / row["decode_ms"]
            rows.append(row)
            console.log(
                f"{variant:10s} {length:6d} tokens: step {row['decode_ms']:.1f} ms, "
                f"block of {gamma + 1} {row['block_ms']:.1f} ms, prefill {row['prefill_s']:.0f} s"
                f"{' (loaded)' if prefix.loaded else ''}"
            )
            del prefix
        lm.close()
    base = {r["context"]: r for r in rows if r["variant"] == "f16"}
    for row in rows:
        if row["context"] in base:
            ref = base[row["context"]]
            row["step_vs_f16"] = row["decode_ms"] / ref["decode_ms"]
            row["block_vs_f16"] = row["block_ms"] / ref["block_ms"]
    payload = {
        "benchmark": "per-step costs of the long-context target under llama.cpp switches",
        "model": model,
        "gamma": gamma,
        "repeats": repeats,
        "machine": {
            "cpus": cores,
            "threads": len(cores),
            "before": before,
            "after": machine_state(),
        },  # fmt: skip
        "variants": {v: VARIANTS[v] for v in variants},
        "rows": rows,
        "slopes_ms_per_1k": _slopes(rows),
    }
    save_json(out, name, payload)
    _plot(rows, gamma, out, name)
    return payload


def _slopes(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Least-squares slope of step and block cost in context length (ms per 1K tokens)."""
    import numpy as np

    slopes = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        if len(mine) < 2:
            continue
        xs = np.array([r["context"] / 1024 for r in mine])
        slopes[variant] = {
            what: float(np.polyfit(xs, [r[f"{what}_ms"] for r in mine], 1)[0])
            for what in ("decode", "block")
        }
    return slopes


def _plot(rows: list[dict], gamma: int, out: Path, name: str) -> Path:
    from benchmarks.report import new_figure, save_png

    fig, axes = new_figure(ncols=2, size=(5.0, 3.6))
    for ax, what, title in (
        (axes[0][0], "decode_ms", "one decode step"),
        (axes[0][1], "block_ms", f"one {gamma + 1}-token block"),
    ):
        for variant in dict.fromkeys(r["variant"] for r in rows):
            mine = [r for r in rows if r["variant"] == variant]
            ax.plot([r["context"] for r in mine], [r[what] for r in mine], marker="o",
                    label=variant)  # fmt: skip
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    return save_png(fig, out, name)
