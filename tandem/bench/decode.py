"""`tandem bench decode`: prefill latency and per-token decode latency vs context length.

These are the profiles DRAGON's scheduler fits (decode latency linear in context length,
least squares) and the speculative modes reason with (T_draft, T_verify). For each model and
context length L: one warm-up, then `repeats` timed prefills of L tokens, then `decode_tokens`
single-token decode steps after each prefill (mean per token), and one multi-token decode of
`verify_tokens` tokens (the cost of a verification block).
"""

from __future__ import annotations

import gc
import inspect
import statistics
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tandem.bench.report import new_figure, save_json, save_png


def context_ids(tokenizer, length: int) -> list[int]:
    """A deterministic real-code context of exactly `length` tokens (from the stdlib source)."""
    import json as source_module

    text = inspect.getsource(source_module.decoder) + inspect.getsource(source_module.encoder)
    ids = tokenizer.encode(text)
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


def profile_model(
    lm, contexts: list[int], decode_tokens: int, repeats: int, verify_tokens: int, progress=None
):
    rows = []
    task = progress.add_task(lm.name, total=len(contexts)) if progress else None
    base = context_ids(lm.tokenizer, max(contexts) + decode_tokens + verify_tokens)
    for length in contexts:
        ids = base[:length]
        prefill_s, step_s, block_s = [], [], []
        for rep in range(repeats + 1):  # rep 0 is the warm-up, discarded
            t0 = time.perf_counter()
            state = lm.prefill(ids)
            t1 = time.perf_counter()
            steps = []
            for i in range(decode_tokens):
                s0 = time.perf_counter()
                lm.decode(state, [base[length + i]])
                steps.append(time.perf_counter() - s0)
            lm.rollback(state, decode_tokens)
            b0 = time.perf_counter()
            lm.decode(state, [base[length : length + verify_tokens]])
            b1 = time.perf_counter()
            if rep:
                prefill_s.append(t1 - t0)
                step_s.append(statistics.mean(steps))
                block_s.append(b1 - b0)
        rows.append(
            {
                "context": length,
                "prefill_ms": 1000 * statistics.median(prefill_s),
                "decode_ms_per_token": 1000 * statistics.median(step_s),
                "verify_block_ms": 1000 * statistics.median(block_s),
                "verify_tokens": verify_tokens,
            }
        )
        if progress:
            progress.advance(task)
    ctx = np.array([r["context"] for r in rows], dtype=float)
    dec = np.array([r["decode_ms_per_token"] for r in rows])
    slope, intercept = np.polyfit(ctx, dec, 1)
    return {
        "model": lm.name,
        "points": rows,
        "decode_fit": {"intercept_ms": float(intercept), "slope_ms_per_token": float(slope)},
    }


def run(
    *,
    models: list[str],
    contexts: list[int],
    decode_tokens: int = 8,
    repeats: int = 2,
    verify_tokens: int = 5,
    out: Path = Path("bench/results"),
) -> dict:
    from tandem.models.registry import load_model

    results = []
    with Progress(transient=True) as progress:
        for name in models:
            lm = load_model(name, progress=False)
            results.append(
                profile_model(lm, sorted(contexts), decode_tokens, repeats, verify_tokens, progress)
            )
            del lm
            gc.collect()
    payload = {
        "benchmark": "decode",
        "decode_tokens": decode_tokens,
        "repeats": repeats,
        "models": results,
    }
    json_path = save_json(out, "decode", payload)

    fig, axes = new_figure(ncols=2)
    for res in results:
        ctx = [p["context"] for p in res["points"]]
        axes[0][0].plot(ctx, [p["prefill_ms"] for p in res["points"]], "o-", label=res["model"])
        axes[0][1].plot(
            ctx, [p["decode_ms_per_token"] for p in res["points"]], "o-", label=res["model"]
        )
        fit = res["decode_fit"]
        axes[0][1].plot(
            ctx, [fit["intercept_ms"] + fit["slope_ms_per_token"] * c for c in ctx], "k:", lw=1
        )
    axes[0][0].set(xlabel="context tokens", ylabel="prefill ms", title="prefill latency")
    axes[0][1].set(
        xlabel="context tokens", ylabel="ms / token", title="decode latency (dotted: LSQ fit)"
    )
    for ax in axes[0]:
        ax.legend()
        ax.grid(alpha=0.3)
    png_path = save_png(fig, out, "decode")

    table = Table("model", "context", "prefill ms", "decode ms/token", "verify block ms")
    for res in results:
        for p in res["points"]:
            table.add_row(
                res["model"],
                str(p["context"]),
                f"{p['prefill_ms']:.1f}",
                f"{p['decode_ms_per_token']:.1f}",
                f"{p['verify_block_ms']:.1f}",
            )
    console = Console()
    console.print(table)
    for res in results:
        fit = res["decode_fit"]
        console.print(
            f"{res['model']}: decode ms/token ≈ {fit['intercept_ms']:.1f} + {fit['slope_ms_per_token'] * 1000:.2f}e-3 × context"
        )
    if len(results) == 2:
        a, b = results
        ratio = b["points"][0]["decode_ms_per_token"] / a["points"][0]["decode_ms_per_token"]
        console.print(
            f"{b['model']} / {a['model']} decode latency at context {a['points'][0]['context']}: {ratio:.2f}x"
        )
    console.print(f"saved {json_path} and {png_path}")
    return payload
