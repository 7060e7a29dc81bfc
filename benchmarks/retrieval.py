"""`tandem bench retrieval`: the costs of the retrieval layer, measured side by side.

1. index build (read + chunk with the Qwen tokenizer + embed with MiniLM + write) on the
   stdlib corpus (a subset when quick) and on the example private notes: time and size;
2. query latency: embedding one query, then searching flat vs HNSW (faiss only);
3. recall@10 of HNSW against flat, on the stdlib index with held-out queries and on a larger
   synthetic clustered set where approximate search starts to pay;
4. cost per call of the dynamic relevance scorers (MiniLM bi-encoder, BM25) on a retrieved
   set of 8 chunks with a ~1000-character context;
5. document KV store on the real 0.5B model: loading a document's KV cache vs prefilling it
   again, per document length (64 tokens: DRAGON's chunks; 512: RAPID's), and its size.

Warm-up runs are discarded; medians are reported. Results: benchmarks/results/retrieval.{json,png}.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks import RESULTS
from benchmarks.report import median_seconds, new_figure, save_json, save_png

NOTES = Path(__file__).resolve().parents[1] / "examples" / "private-notes"
TOKENIZER = "qwen2.5-coder-0.5b"


def recall_at(approx_rows: np.ndarray, exact_rows: np.ndarray, k: int = 10) -> float:
    """Mean fraction of the exact top-k found in the approximate top-k. rows: [queries, k]."""
    hits = [len(set(a[:k]) & set(e[:k])) / k for a, e in zip(approx_rows, exact_rows, strict=True)]
    return float(np.mean(hits))


def bench_build(sources: list, tokenizer, embedder, work: Path, name: str) -> dict:
    from tandem.retrieval.chunking import ChunkParams
    from tandem.retrieval.index import build_index

    report = build_index(
        sources,
        work / name,
        tokenizer=tokenizer,
        tokenizer_name=TOKENIZER,
        embedder=embedder,
        params=ChunkParams(chunk_tokens=64, overlap=0),
        on_skip=lambda p, r: None,
    )
    m = report.manifest
    return {
        "corpus": name,
        "documents": m.documents,
        "chunks": m.chunks,
        "tokens": m.tokens,
        "build_s": report.seconds,
        "bytes": report.bytes,
        "chunks_per_s": m.chunks / report.seconds,
    }


def bench_search(index_dir: Path, embedder, queries: list[str], synthetic_n: int) -> dict:
    from tandem.retrieval.index import open_index
    from tandem.retrieval.search import index_vectors, make_faiss_index

    retriever = open_index(index_dir, embedder=embedder)
    vectors = index_vectors(retriever.index)  # [n, dim]
    query_vectors = embedder.embed(queries)  # [q, dim]
    embed_s = median_seconds(lambda: embedder.embed([queries[0]]), repeats=20, warmup=2)
    results = {"embed_query_ms": 1000 * embed_s, "queries": len(queries), "sets": []}
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(256, vectors.shape[1]))
    synthetic = centers[rng.integers(0, 256, synthetic_n)] + 0.6 * rng.normal(
        size=(synthetic_n, vectors.shape[1])
    )
    synthetic /= np.linalg.norm(synthetic, axis=1, keepdims=True)
    synthetic_queries = synthetic[rng.integers(0, synthetic_n, 200)] + 0.3 * rng.normal(
        size=(200, vectors.shape[1])
    )
    synthetic_queries /= np.linalg.norm(synthetic_queries, axis=1, keepdims=True)
    for label, base, probes in [
        ("stdlib", vectors, query_vectors),
        (
            f"synthetic-{synthetic_n // 1000}k",
            synthetic.astype(np.float32),
            synthetic_queries.astype(np.float32),
        ),
    ]:
        row = {"set": label, "vectors": int(len(base))}
        found = {}
        for kind in ("flat", "hnsw"):
            began = time.perf_counter()
            index = make_faiss_index(kind, base)
            row[f"{kind}_build_s"] = time.perf_counter() - began
            _, found[kind] = index.search(probes, 10)
            row[f"{kind}_search_ms"] = 1000 * median_seconds(
                lambda i=index, q=probes[:1]: i.search(q, 10), repeats=50, warmup=5
            )
        row["hnsw_recall_at_10"] = recall_at(found["hnsw"], found["flat"])
        row["ef_sweep"] = []
        for ef in (16, 64, 256):  # the search-time knob: recall against latency
            index.hnsw.efSearch = ef
            _, rows_ef = index.search(probes, 10)
            ms = 1000 * median_seconds(lambda i=index, q=probes[:1]: i.search(q, 10), repeats=50)
            row["ef_sweep"].append(
                {"ef_search": ef, "recall_at_10": recall_at(rows_ef, found["flat"]), "ms": ms}
            )
        results["sets"].append(row)
    retriever.lookup.close()
    return results


def bench_scorers(retriever_dir: Path, embedder, query: str) -> list[dict]:
    from tandem.retrieval.index import open_index
    from tandem.retrieval.scorer import BM25Scorer, EmbeddingScorer

    retriever = open_index(retriever_dir, embedder=embedder)
    docs = [c.text for c, _ in retriever.search(query, 8)]
    retriever.lookup.close()
    context = query + "\n" + " ".join(docs)[:1000]
    rows = []
    for scorer in (EmbeddingScorer(embedder, docs), BM25Scorer(docs)):
        seconds = median_seconds(lambda s=scorer: s.score(context), repeats=20, warmup=2)
        rows.append({"scorer": scorer.name, "docs": len(docs), "ms_per_call": 1000 * seconds})
    return rows


def bench_kv(lm, texts: list[str], lengths: list[int], work: Path) -> list[dict]:
    """Per document length: prefill vs load, and time to the first query logits both ways
    (prefill document + query, against load + decode the query: DRAGON's TTFT premise)."""
    from tandem.retrieval.kvstore import DocKVStore

    store = DocKVStore(work / "kv", lm)
    ids_all = lm.tokenizer.encode("\n\n".join(texts))
    query = lm.tokenizer.encode("\nQuestion: which function in this module should I call?")
    config = getattr(getattr(lm, "model", None), "config", None)  # transformers only
    rows = []
    for length in lengths:
        docs = [ids_all[i * length : (i + 1) * length] for i in range(3)]
        lm.prefill(docs[0])  # warm-up
        recompute = [median_seconds(lambda d=d: lm.prefill(d), repeats=3, warmup=0) for d in docs]
        for d in docs:
            store.put(d)
        store.load(docs[0])  # warm-up
        load = [median_seconds(lambda d=d: store.load(d), repeats=3, warmup=0) for d in docs]
        error = max(
            float((store.load(d).logits - lm.prefill(d).logits).abs().max()) for d in docs[:1]
        )
        ttft_recompute = [
            median_seconds(lambda d=d: lm.prefill(d + query), repeats=3, warmup=0) for d in docs
        ]
        ttft_load = [
            median_seconds(lambda d=d: lm.decode(store.load(d), [query]), repeats=3, warmup=0)
            for d in docs
        ]
        if config is not None:  # fp32 keys and values of every layer
            head_dim = getattr(config, "head_dim", None) or (
                config.hidden_size // config.num_attention_heads
            )
            kv_bytes = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * length
            kv_bytes *= 4
        else:  # llama.cpp's own per-sequence state (f16 keys and values)
            kv_bytes = store.nbytes(docs[0])
        rows.append(
            {
                "doc_tokens": length,
                "docs": len(docs),
                "recompute_ms": 1000 * statistics.median(recompute),
                "load_ms": 1000 * statistics.median(load),
                "speedup": statistics.median(recompute) / statistics.median(load),
                "query_tokens": len(query),
                "ttft_recompute_ms": 1000 * statistics.median(ttft_recompute),
                "ttft_load_ms": 1000 * statistics.median(ttft_load),
                "file_bytes": store.nbytes(docs[0]),
                "kv_bytes": kv_bytes,
                "kv_bytes_per_token": kv_bytes // length,
                "max_logit_error": error,
            }
        )
    return rows


def run(*, out: Path = RESULTS, quick: bool = False, threads: int = 1) -> dict:
    """`threads`: torch threads for every measurement (1 by default: on a shared 2-core machine
    a single thread gives far steadier medians than two that wait on each other)."""
    import faiss
    import torch

    previous = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    try:
        return _run(out=out, quick=quick)
    finally:
        torch.set_num_threads(previous[0])
        faiss.omp_set_num_threads(previous[1])


def _run(*, out: Path, quick: bool) -> dict:
    import torch

    from tandem.models.registry import load_model, load_tokenizer
    from tandem.retrieval.embedder import load_embedder
    from tandem.retrieval.stdlib import split_by_package, stdlib_documents

    console = Console()
    tokenizer = load_tokenizer(TOKENIZER, progress=False)
    embedder = load_embedder("all-minilm-l6-v2")
    docs = stdlib_documents()
    retrieval_docs, test_docs = split_by_package(docs)
    if quick:
        retrieval_docs = retrieval_docs[::6]
    queries = [
        d.text.split("\n\n", 1)[-1][:300] for d in test_docs[:: max(1, len(test_docs) // 100)]
    ][:100]
    with tempfile.TemporaryDirectory(prefix="tandem-bench-retrieval-") as tmp:
        work = Path(tmp)
        with console.status("building indexes (stdlib, notes)..."):
            corpus_jsonl = work / "stdlib.jsonl"
            corpus_jsonl.write_text(
                "".join(
                    json.dumps({"id": d.doc_id, "text": d.text, "meta": dict(d.meta)}) + "\n"
                    for d in retrieval_docs
                )
            )
            builds = [
                bench_build(
                    [corpus_jsonl],
                    tokenizer,
                    embedder,
                    work,
                    "stdlib" + ("-sixth" if quick else ""),
                ),
                bench_build([NOTES], tokenizer, embedder, work, "private-notes"),
            ]
        stdlib_dir = work / builds[0]["corpus"]
        with console.status("query latency and HNSW recall..."):
            search = bench_search(
                stdlib_dir, embedder, queries, synthetic_n=20_000 if quick else 100_000
            )
            scorers = bench_scorers(stdlib_dir, embedder, queries[0])
        with console.status("KV store vs prefill on the 0.5B model..."):
            lm = load_model(TOKENIZER, progress=False)
            kv = bench_kv(
                lm, [d.text for d in test_docs[:200]], [64, 512] if not quick else [64, 256], work
            )
    payload = {
        "benchmark": "retrieval",
        "quick": quick,
        "torch_threads": torch.get_num_threads(),
        "tokenizer": TOKENIZER,
        "embedder": embedder.name,
        "builds": builds,
        "search": search,
        "scorers": scorers,
        "kv": kv,
    }
    save_json(out, "retrieval", payload)
    save_png(plot(payload), out, "retrieval")
    print_tables(console, payload)
    return payload


def plot(payload: dict):
    fig, axes = new_figure(ncols=3, size=(4.5, 3.6))
    sets = payload["search"]["sets"]
    x = np.arange(len(sets))
    axes[0][0].bar(x - 0.2, [s["flat_search_ms"] for s in sets], 0.4, label="flat")
    axes[0][0].bar(x + 0.2, [s["hnsw_search_ms"] for s in sets], 0.4, label="hnsw")
    axes[0][0].set_xticks(x, [f"{s['set']}\nrecall@10 {s['hnsw_recall_at_10']:.3f}" for s in sets])
    axes[0][0].set(ylabel="ms per query (faiss only)", title="search latency")
    kv = payload["kv"]
    x = np.arange(len(kv))
    bars = [
        ("recompute_ms", "prefill document"),
        ("load_ms", "load document KV"),
        ("ttft_recompute_ms", "TTFT: prefill doc + query"),
        ("ttft_load_ms", "TTFT: load + decode query"),
    ]
    for i, (key, label) in enumerate(bars):
        axes[0][1].bar(x + 0.2 * (i - 1.5), [r[key] for r in kv], 0.2, label=label)
    axes[0][1].set_xticks(x, [f"{r['doc_tokens']} tokens" for r in kv])
    axes[0][1].set_yscale("log")
    axes[0][1].set(ylabel="ms per document (log)", title="document KV: load vs recompute")
    axes[0][2].bar(x, [r["kv_bytes"] / 1e6 for r in kv], 0.5, label="KV only")
    axes[0][2].bar(
        x,
        [(r["file_bytes"] - r["kv_bytes"]) / 1e6 for r in kv],
        0.5,
        bottom=[r["kv_bytes"] / 1e6 for r in kv],
        label="+ logits, ids",
    )
    axes[0][2].set_xticks(x, [f"{r['doc_tokens']} tokens" for r in kv])
    axes[0][2].set(ylabel="MB per document", title="KV cache size (fp32)")
    for ax in axes[0]:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    return fig


def print_tables(console: Console, payload: dict) -> None:
    table = Table("corpus", "docs", "chunks", "tokens", "build s", "chunks/s", "MB")
    for b in payload["builds"]:
        table.add_row(
            b["corpus"],
            str(b["documents"]),
            str(b["chunks"]),
            str(b["tokens"]),
            f"{b['build_s']:.1f}",
            f"{b['chunks_per_s']:.0f}",
            f"{b['bytes'] / 1e6:.2f}",
        )
    console.print(table)
    console.print(
        f"query embedding (MiniLM, 1 query): {payload['search']['embed_query_ms']:.1f} ms"
    )
    table = Table(
        "set", "vectors", "flat ms", "hnsw ms", "flat/hnsw", "hnsw recall@10", "hnsw build s"
    )
    for s in payload["search"]["sets"]:
        table.add_row(
            s["set"],
            str(s["vectors"]),
            f"{s['flat_search_ms']:.3f}",
            f"{s['hnsw_search_ms']:.3f}",
            f"{s['flat_search_ms'] / s['hnsw_search_ms']:.1f}x",
            f"{s['hnsw_recall_at_10']:.3f}",
            f"{s['hnsw_build_s']:.1f}",
        )
    console.print(table)
    table = Table("scorer", "docs", "ms per call")
    for s in payload["scorers"]:
        table.add_row(s["scorer"], str(s["docs"]), f"{s['ms_per_call']:.2f}")
    console.print(table)
    for s in payload["search"]["sets"]:
        sweep = ", ".join(
            f"ef {e['ef_search']}: recall {e['recall_at_10']:.3f} in {e['ms']:.3f} ms"
            for e in s["ef_sweep"]
        )
        console.print(f"hnsw on {s['set']}: {sweep}")
    table = Table("doc tokens", "prefill ms", "load ms", "prefill/load", "max |dlogit|")
    for r in payload["kv"]:
        table.add_row(
            str(r["doc_tokens"]),
            f"{r['recompute_ms']:.1f}",
            f"{r['load_ms']:.1f}",
            f"{r['speedup']:.0f}x",
            f"{r['max_logit_error']:.1e}",
        )
    console.print(table)
    table = Table("doc tokens", "TTFT prefill ms", "TTFT load ms", "ratio", "file MB", "KV MB")
    for r in payload["kv"]:
        table.add_row(
            f"{r['doc_tokens']} + {r['query_tokens']} query",
            f"{r['ttft_recompute_ms']:.1f}",
            f"{r['ttft_load_ms']:.1f}",
            f"{r['ttft_recompute_ms'] / r['ttft_load_ms']:.1f}x",
            f"{r['file_bytes'] / 1e6:.2f}",
            f"{r['kv_bytes'] / 1e6:.2f} ({r['kv_bytes_per_token']} B/token)",
        )
    console.print(table)
