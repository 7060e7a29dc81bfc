"""`tandem bench codecs`: what each distribution codec costs on real next-token distributions.

The real Qwen2.5-Coder-0.5B scores a Python stdlib source file (teacher-forced, one forward
pass); every position's next-token distribution (softmax of logits / temperature) is sent
through every codec, row by row with the codecs interleaved so they share the same machine
state. Per token and codec: payload bytes (== ceil(bits / 8), checked), encode and decode
time, TV distance between the original and the sent distribution (checked == the decoded
one). C-SQS advances its threshold on every position, as if every draft were accepted.
The first `WARMUP_ROWS` rows are coded once beforehand and discarded.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import new_figure, save_json, save_png
from tandem.codecs import Codec, make_codec, tv_distance
from tandem.codecs.base import as_numpy_probs

WARMUP_ROWS = 3

# label -> (codec name, parameters); compared side by side
CODECS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense fp16": ("dense", {}),
    "top-p 0.8": ("top-p", {"p": 0.8}),
    "top-k 8": ("top-k", {"k": 8}),
    "top-k 32": ("top-k", {"k": 32}),
    "k-sqs K=8": ("k-sqs", {"k": 8, "ell": 100}),
    "k-sqs K=32": ("k-sqs", {"k": 32, "ell": 100}),
    "c-sqs a=5e-4 (paper)": ("c-sqs", {"alpha": 0.0005, "eta": 0.001, "beta": 0.001}),
    "c-sqs a=0.05": ("c-sqs", {"alpha": 0.05, "eta": 0.001, "beta": 0.001}),
}


def source_ids(tokenizer, module_name: str, num_tokens: int) -> list[int]:
    """The first `num_tokens` + 1 tokens of a stdlib module's source (real public code)."""
    text = inspect.getsource(importlib.import_module(module_name))
    return tokenizer.encode(text)[: num_tokens + 1]


def next_token_probs(lm, ids: list[int], temperature: float) -> torch.Tensor:
    """[len(ids), vocab] float32 next-token distributions of a teacher-forced sequence."""
    with torch.no_grad():
        logits = lm.score(ids).float()
    return torch.softmax(logits / temperature, dim=-1)


def code_one(codec: Codec, probs: torch.Tensor) -> dict[str, float]:
    """Encode + decode one [vocab] distribution; times in microseconds."""
    t0 = time.perf_counter()
    payload = codec.encode(probs)
    t1 = time.perf_counter()
    decoded = codec.decode(payload, probs.shape[0])
    t2 = time.perf_counter()
    sent = codec.transmitted_probs(probs)
    if not torch.equal(decoded, sent):
        raise AssertionError(f"{codec.name}: decoded != transmitted_probs")
    bits = codec.bits(probs)
    if len(payload) != (bits + 7) // 8:
        raise AssertionError(f"{codec.name}: {len(payload)} bytes for {bits} bits")
    row = {
        "bytes": len(payload),
        "bits": bits,
        "encode_us": (t1 - t0) * 1e6,
        "decode_us": (t2 - t1) * 1e6,
        "tv": tv_distance(probs, decoded),
        "tv_bound": codec.tv_bound(probs),
        "nonzero": int(torch.count_nonzero(decoded)),
    }
    support = getattr(codec, "support", None)
    if support is not None:  # SQS: tokens in the coded support (zero counts included)
        row["support"] = int(support(as_numpy_probs(probs)).shape[0])
    if codec.name == "c-sqs":
        row["beta"] = codec.state.beta
    codec.observe(probs)
    return row


def summarize(rows: list[dict[str, float]], dense_bytes: float) -> dict[str, float]:
    def column(key: str) -> list[float]:
        return [row[key] for row in rows]

    summary = {
        "bytes_mean": statistics.fmean(column("bytes")),
        "bytes_median": statistics.median(column("bytes")),
        "bytes_p90": float(np.percentile(column("bytes"), 90)),
        "bytes_max": max(column("bytes")),
        "bits_mean": statistics.fmean(column("bits")),
        "compression_vs_dense": dense_bytes / statistics.fmean(column("bytes")),
        "encode_us_median": statistics.median(column("encode_us")),
        "decode_us_median": statistics.median(column("decode_us")),
        "codec_us_median": statistics.median(r["encode_us"] + r["decode_us"] for r in rows),
        "codec_us_mean": statistics.fmean(r["encode_us"] + r["decode_us"] for r in rows),
        "tv_mean": statistics.fmean(column("tv")),
        "tv_max": max(column("tv")),
        "tv_bound_mean": statistics.fmean(column("tv_bound")),
        "nonzero_mean": statistics.fmean(column("nonzero")),
    }
    if "support" in rows[0]:
        summary["support_mean"] = statistics.fmean(column("support"))
        summary["support_max"] = max(column("support"))
    return summary


def run(
    out: Path = RESULTS,
    quick: bool = False,
    *,
    model: str = "qwen2.5-coder-0.5b",
    module: str = "textwrap",
    num_tokens: int = 300,
    temperature: float = 1.0,
) -> dict[str, Any]:
    """Bytes per token, coding time and TV error of every codec in `CODECS`; JSON + PNG."""
    from tandem.models.registry import load_model

    num_tokens = min(num_tokens, 48) if quick else num_tokens
    lm = load_model(model)
    ids = source_ids(lm.tokenizer, module, num_tokens + WARMUP_ROWS)
    all_probs = next_token_probs(lm, ids[:-1], temperature)  # [tokens, vocab]
    vocab = int(all_probs.shape[1])

    codecs = {label: make_codec(name, **params) for label, (name, params) in CODECS.items()}
    for codec in codecs.values():  # warm-up, discarded (C-SQS restarts from its initial beta)
        for probs in all_probs[:WARMUP_ROWS]:
            code_one(codec, probs)
    codecs = {label: make_codec(name, **params) for label, (name, params) in CODECS.items()}

    rows: dict[str, list[dict[str, float]]] = {label: [] for label in codecs}
    with Progress(transient=True) as progress:
        task = progress.add_task("coding distributions", total=num_tokens)
        for probs in all_probs[WARMUP_ROWS:]:
            for label, codec in codecs.items():
                rows[label].append(code_one(codec, probs))
            progress.advance(task)

    dense_bytes = statistics.fmean(r["bytes"] for r in rows["dense fp16"])
    summaries = {label: summarize(rows[label], dense_bytes) for label in codecs}
    result = {
        "config": {
            "model": model,
            "text": f"inspect.getsource({module})",
            "num_tokens": len(rows["dense fp16"]),
            "warmup_rows": WARMUP_ROWS,
            "temperature": temperature,
            "vocab": vocab,
            "codecs": {label: {"name": n, **p} for label, (n, p) in CODECS.items()},
        },
        "summary": summaries,
        "per_token": {
            label: {key: [row[key] for row in rows[label]] for key in rows[label][0]}
            for label in codecs
        },
    }
    save_json(out, "codecs", result)
    plot(out, summaries, result["per_token"])
    print_table(summaries, result["config"])
    return result


def print_table(summaries: dict[str, dict[str, float]], config: dict[str, Any]) -> None:
    table = Table(
        title=f"codecs on {config['num_tokens']} {config['model']} next-token distributions"
        f" ({config['text']}, T={config['temperature']}, V={config['vocab']})"
    )
    for header in ["codec", "bytes/token", "p90", "x vs dense", "encode µs", "decode µs",
                   "TV mean", "TV max", "bound mean", "tokens sent"]:  # fmt: skip
        table.add_column(header, justify="left" if header == "codec" else "right")
    for label, s in summaries.items():
        sent = f"{s['nonzero_mean']:.1f}"
        if "support_mean" in s:
            sent += f" (K {s['support_mean']:.0f})"
        table.add_row(
            label,
            f"{s['bytes_mean']:.1f}",
            f"{s['bytes_p90']:.0f}",
            f"{s['compression_vs_dense']:.0f}",
            f"{s['encode_us_median']:.0f}",
            f"{s['decode_us_median']:.0f}",
            f"{s['tv_mean']:.4f}",
            f"{s['tv_max']:.3f}",
            f"{s['tv_bound_mean']:.3f}",
            sent,
        )
    console = Console()
    if not console.is_terminal:  # logs and pipes: do not squeeze the columns to 80
        console = Console(width=170)
    console.print(table)


def plot(out: Path, summaries: dict[str, dict[str, float]], per_token: dict[str, dict]) -> None:
    labels = list(summaries)
    fig, axes = new_figure(ncols=2, nrows=2, size=(6.5, 4.0))
    panels = [
        (axes[0][0], "bytes_mean", "bytes per token (log)", True),
        (axes[0][1], "tv_mean", "mean TV(original, sent)", False),
        (axes[1][0], "codec_us_median", "encode + decode µs per token, median (log)", True),
    ]
    for ax, key, title, log in panels:
        ax.barh(labels, [summaries[label][key] for label in labels], color="tab:blue")
        ax.invert_yaxis()
        ax.set_title(title)
        if log:
            ax.set_xscale("log")
    ax = axes[1][1]
    for label in labels:
        if "beta" in per_token[label]:
            ax.plot(per_token[label]["support"], label=f"{label}: K")
    ax.set_yscale("log")
    ax.set_xlabel("token position")
    ax.set_title("C-SQS support size K per token")
    ax.legend(fontsize=8)
    save_png(fig, out, "codecs")
