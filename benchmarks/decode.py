"""`tandem bench decode`: what one step of each engine costs, side by side in one run.

For each backend (llamacpp, hf) and model, one worker process (fresh memory, the same pinned
cores and thread count for all) measures:
- *prefill* of L context tokens and *decode* per token after it (mean of `decode_tokens`
  single-token steps), for every context length L; the profiles DRAGON's scheduler fits
  (decode latency linear in context, least squares) and the speculative modes reason with;
- *verify k*: one decode call of k = 1..8 tokens at context `probe_context` (the cost of a
  verification block), rolled back after each;
- *rows n*: one decode step of n = 1..4 rows stacked in one call (the cloud batcher's cost);
- *raw*: for llamacpp, the same single-token decode through llama-cpp-python's own `Llama`
  (its high-level API, as a user would run it) in the same worker: the wrapper's overhead;
- *memory*: the worker's resident set after loading and after the largest context, against
  the GGUF's size on disk.
Every figure is a median over `repeats` repeats after one discarded warm-up. transformers runs
contexts up to `hf_max_context` only (its fp32 prefill of 4096 tokens takes minutes here).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import median_seconds, new_figure, save_json, save_png

VERIFY_K = tuple(range(1, 9))
ROWS = tuple(range(1, 5))


def context_ids(tokenizer, length: int) -> list[int]:
    """A deterministic real-code context of exactly `length` tokens (from the stdlib source)."""
    import json as source_module

    text = inspect.getsource(source_module.decoder) + inspect.getsource(source_module.encoder)
    ids = tokenizer.encode(text)
    while len(ids) < length:
        ids = ids + ids
    return ids[:length]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _ms(call, repeats: int) -> float:
    return 1000 * median_seconds(call, repeats)  # one discarded warm-up first


def profile_model(lm, contexts: list[int], decode_tokens: int, repeats: int, probe: int) -> dict:
    """Prefill / decode per context, verify-k and rows-n at `probe` context (in-process)."""
    base = context_ids(lm.tokenizer, max(contexts + [probe]) + decode_tokens + max(VERIFY_K))
    points = []
    for length in contexts:
        ids = base[:length]
        prefill_ms = _ms(lambda ids=ids: lm.prefill(ids), repeats)
        state = lm.prefill(ids)

        def steps(state=state, length=length):
            for i in range(decode_tokens):
                lm.decode(state, [base[length + i]])
            lm.rollback(state, decode_tokens)

        decode_ms = _ms(steps, repeats) / decode_tokens
        points.append({"context": length, "prefill_ms": prefill_ms, "decode_ms": decode_ms})
        del state
    state = lm.prefill(base[:probe])

    def block(k: int):
        lm.decode(state, [base[probe : probe + k]])
        lm.rollback(state, k)

    verify = {k: _ms(lambda k=k: block(k), repeats) for k in VERIFY_K}
    state = lm.prefill(base[:probe])  # with its logits (a rollback past them drops them)
    rows = {}
    for n in ROWS:
        stacked = lm.stack([state] * n)

        def step(stacked=stacked, n=n):
            lm.decode(stacked, [[base[probe]]] * n)
            lm.rollback(stacked, 1)

        rows[n] = _ms(step, repeats)
        del stacked
    ctx = np.array([p["context"] for p in points], dtype=float)
    dec = np.array([p["decode_ms"] for p in points])
    slope, intercept = np.polyfit(ctx, dec, 1) if len(points) > 1 else (0.0, float(dec[0]))
    return {
        "points": points,
        "decode_fit": {"intercept_ms": float(intercept), "slope_ms_per_token": float(slope)},
        "probe_context": probe,
        "verify_ms": verify,
        "rows_ms": rows,
    }


def raw_decode(path: Path, tokenizer, contexts, decode_tokens, repeats, threads) -> dict:
    """Single-token decode per context through llama-cpp-python's `Llama` (no tandem code)."""
    import llama_cpp

    n_ctx = max(contexts) + decode_tokens + 16
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
        n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    base = context_ids(tokenizer, max(contexts) + decode_tokens)
    out = {}
    for length in contexts:
        llm.reset()
        llm.eval(base[:length])

        def steps(length=length):
            for i in range(decode_tokens):
                llm.eval([base[length + i]])
            llm.n_tokens -= decode_tokens  # eval() drops the KV past n_tokens first

        out[length] = _ms(steps, repeats) / decode_tokens
    return out


def worker(spec: dict) -> dict:
    """One (backend, model) in this process: the whole profile, as a dict."""
    from tandem.models.llamacpp import default_threads
    from tandem.models.registry import gguf_dir, load_model
    from tandem.testbed.cpus import machine_state, pin

    if spec.get("cores"):
        pin(spec["cores"])
    rss_start = _rss_mb()
    t0 = time.perf_counter()
    lm = load_model(spec["model"], progress=False, backend=spec["backend"])
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_mb()
    result = {
        "backend": spec["backend"],
        "model": spec["model"],
        "threads": default_threads(),
        "load_s": load_s,
        **profile_model(
            lm, spec["contexts"], spec["decode_tokens"], spec["repeats"], spec["probe"]
        ),
    }
    gguf = gguf_dir(spec["model"]) / "model.gguf"
    result["memory"] = {
        "rss_start_mb": rss_start,
        "rss_loaded_mb": rss_loaded,
        "rss_after_mb": _rss_mb(),
        "gguf_mb": gguf.stat().st_size / 2**20 if gguf.exists() else None,
    }
    if spec["backend"] == "llamacpp":
        result["raw_decode_ms"] = raw_decode(
            gguf, lm.tokenizer, spec["contexts"], spec["decode_tokens"], spec["repeats"],
            default_threads(),
        )  # fmt: skip
    result["machine"] = machine_state()
    return result


def _spawn(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.decode", json.dumps(spec)],
        capture_output=True,
        text=True,
        env={**os.environ, "TANDEM_BACKEND": spec["backend"]},
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{spec['backend']}/{spec['model']} worker failed: " + " | ".join(tail))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(
    *,
    models: list[str],
    backends: list[str],
    contexts: list[int],
    decode_tokens: int = 16,
    repeats: int = 2,
    probe: int = 256,
    hf_max_context: int = 1024,
    cores: list[int] | None = None,
    out: Path = RESULTS,
) -> dict:
    from rich.progress import Progress

    from tandem.models.registry import check_backend

    for backend in backends:
        check_backend(backend)
    results = []
    jobs = [(b, m) for m in models for b in backends]
    with Progress(transient=True) as progress:
        task = progress.add_task("engines x models", total=len(jobs))
        for backend, model in jobs:
            ctx = sorted(c for c in contexts if backend != "hf" or c <= hf_max_context)
            progress.update(task, description=f"{backend} {model}")
            spec = {
                "backend": backend, "model": model, "contexts": ctx, "probe": probe,
                "decode_tokens": decode_tokens, "repeats": repeats, "cores": cores,
            }  # fmt: skip
            results.append(_spawn(spec))
            progress.advance(task)
    payload = {
        "benchmark": "decode",
        "decode_tokens": decode_tokens,
        "repeats": repeats,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "results": results,
    }
    save_json(out, "decode", payload)
    plot(results, out)
    report(results)
    return payload


def plot(results: list[dict], out: Path) -> Path:
    fig, axes = new_figure(ncols=4, size=(4.5, 3.8))
    ax_p, ax_d, ax_v, ax_r = axes[0]
    for res in results:
        label = f"{res['model'].removeprefix('qwen2.5-coder-')} {res['backend']}"
        ctx = [p["context"] for p in res["points"]]
        ax_p.plot(ctx, [p["prefill_ms"] for p in res["points"]], "o-", label=label)
        ax_d.plot(ctx, [p["decode_ms"] for p in res["points"]], "o-", label=label)
        if "raw_decode_ms" in res:
            raw = res["raw_decode_ms"]
            ax_d.plot([int(c) for c in raw], list(raw.values()), "k:", lw=1)
        ax_v.plot(VERIFY_K, [res["verify_ms"][str(k)] for k in VERIFY_K], "o-", label=label)
        ax_r.plot(ROWS, [res["rows_ms"][str(n)] for n in ROWS], "o-", label=label)
    ax_p.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="ms", title="prefill")
    ax_d.set(
        xscale="log", yscale="log", xlabel="context tokens", ylabel="ms / token",
        title="decode (dotted: raw llama-cpp-python)",
    )  # fmt: skip
    ax_v.set(yscale="log", xlabel="tokens k in one call", ylabel="ms", title="verify k tokens")
    ax_r.set(yscale="log", xlabel="rows n in one step", ylabel="ms", title="decode n rows")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    ax_d.legend(fontsize=7)
    return save_png(fig, out, "decode")


def report(results: list[dict]) -> None:
    console = Console()
    table = Table("model", "engine", "context", "prefill ms", "decode ms/token", "raw ms/token")
    for res in results:
        raw = res.get("raw_decode_ms", {})
        for p in res["points"]:
            r = raw.get(str(p["context"]))
            table.add_row(
                res["model"], res["backend"], str(p["context"]), f"{p['prefill_ms']:.0f}",
                f"{p['decode_ms']:.1f}", "-" if r is None else f"{r:.1f}",
            )  # fmt: skip
    console.print(table)
    for res in results:
        mem = res["memory"]
        v, r = res["verify_ms"], res["rows_ms"]
        line = (
            f"{res['model']} {res['backend']} ({res['threads']} threads): verify k=1/5/8 "
            f"{v['1']:.0f}/{v['5']:.0f}/{v['8']:.0f} ms, rows 1/4 {r['1']:.0f}/{r['4']:.0f} ms, "
            f"RSS {mem['rss_after_mb']:.0f} MB"
        )
        if mem.get("gguf_mb"):
            line += f" = {mem['rss_after_mb'] / mem['gguf_mb']:.2f}x the GGUF"
        raw = res.get("raw_decode_ms")
        if raw:
            ratios = [p["decode_ms"] / raw[str(p["context"])] for p in res["points"]]
            line += f", wrapper/raw decode {min(ratios):.2f}-{max(ratios):.2f}x"
        console.print(line)


if __name__ == "__main__":  # the worker: one JSON spec in, one JSON line out
    print(json.dumps(worker(json.loads(sys.argv[1]))))
