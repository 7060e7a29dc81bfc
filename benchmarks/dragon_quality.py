"""`tandem bench dragon perplexity`: DRAGON paper Fig. 5 (perplexity vs retrieved documents).

Words used here:
- *passage*: a held-out window of stdlib text (`tandem.retrieval.stdlib.eval_windows` over the
  test part of `split_by_package`: whole top-level packages never seen by the retriever). Its
  first `prefix_tokens` ids are the *prefix* (the retrieval query, decoded to text) and the next
  `scored_tokens` ids the *continuation* whose NLL is scored with teacher forcing.
- *hit*: a retrieved 64-token chunk of the stdlib index (chunks of test packages are dropped),
  with its cosine score; its *relevance logit* is score / `relevance_temperature` (as the live
  system's static scores, `knowledge.build_decoder`). A document is `doc_tokens` ids of its text.
- *split* (who holds which hit at k docs per side): "rank" (paper Sec. 7.2: the cloud holds the
  first half of the top-2k, ranks 0..k-1, the device the second half, ranks k..2k-1) or
  "module" (the corpus is cut in two by a hash of the package name; each side's own top-k).
- *methods*: `none` (no retrieval), `crcg-device` / `crcg-cloud` (that side's k documents
  concatenated before the prefix: context aggregation, centralised), `drcg` (both sides'
  2k documents concatenated, in order of first appearance then score), `dragon` (one row per
  document = document + prefix; per position the law is eta_d p_d + eta_c p_c with
  p_s = sum_{d in s} softmax(R_s)(d) p(.|d, prefix) and eta = softmax(logsumexp R_d,
  logsumexp R_c): `tandem.sampling.aggregation`, as `reference.CentralPair` with the identity
  codec; the NLL only needs each row's probability of the true token, and mixing is linear),
  `dragon-side` (ours, `DragonConfig(rows="side")`: one row per side holding that side's k
  documents concatenated, i.e. CRCG/Device's and CRCG/Cloud's rows, mixed across sides with
  the same weights eta as `dragon`; no extra model call; the live row also names each source
  document and marks left-out chunks: `retrieval.search.joined_in_document_order`).
- *perplexity*: exp(total NLL / total scored tokens) over all passages (corpus level).

Concatenated contexts share their KV cache across k when one context extends the last (the
state is cropped back to the common documents and the new ones decoded: `lm.crop`), so each
document is prefilled once per method wherever the split allows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from tandem.sampling.aggregation import document_mixture, mixture, side_logweight

METHODS = ("none", "crcg-device", "crcg-cloud", "drcg", "dragon", "dragon-side")
SPLITS = ("rank", "module")
SEPARATOR = "\n\n"
PAPER = (
    "Fig. 5 (Qwen2.5-1.5B/WikiText2, OPT-1.3B/WikiText103; k = 0..16 per side, 256-token "
    "context budget): DRAGON matches or beats every baseline at every k and the gap widens "
    "with k; CRCG stays poor; DRCG saturates once the budget is full; DRAGON's gain over no "
    "retrieval is 1.9x (Qwen) and 1.4x (OPT) the second-best method's"
)


@dataclass(frozen=True, kw_only=True)
class QualityConfig:
    ks: tuple[int, ...] = (0, 1, 2, 4, 8)  # documents per side
    passages: int = 16
    prefix_tokens: int = 64
    scored_tokens: int = 32
    doc_tokens: int = 64
    split: str = "rank"
    relevance_temperature: float = 0.1
    test_fraction: float = 0.1  # share of stdlib packages held out (never retrieved)


@dataclass(frozen=True)
class Doc:
    doc_id: str
    text: str
    score: float  # cosine similarity to the prefix


@dataclass(frozen=True)
class Passage:
    name: str
    prefix_ids: tuple[int, ...]
    scored_ids: tuple[int, ...]


@dataclass
class PassageResult:
    name: str
    nll: dict[str, dict[int, float]] = field(default_factory=dict)  # method -> k -> NLL sum
    tokens: int = 0
    seconds: float = 0.0


# -- pure parts -----------------------------------------------------------------------------


def side_docs(hits: Sequence[Doc], k: int, split: str, device_of) -> tuple[list[Doc], list[Doc]]:
    """(device docs, cloud docs) at k per side from one ranked hit list.

    `device_of(doc) -> bool` says which half of the corpus holds a doc ("module" split only)."""
    if split == "rank":
        return list(hits[k : 2 * k]), list(hits[:k])
    if split == "module":
        device = [d for d in hits if device_of(d)][:k]
        cloud = [d for d in hits if not device_of(d)][:k]
        return device, cloud
    raise ValueError(f"unknown split {split!r}")


def union_order(previous: Sequence[Doc], docs: Sequence[Doc]) -> list[Doc]:
    """DRCG's concatenation order: docs already used (in their order), then new ones by score."""
    ids = {d.doc_id for d in docs}
    kept = [d for d in previous if d.doc_id in ids]
    seen = {d.doc_id for d in kept}
    new = sorted((d for d in docs if d.doc_id not in seen), key=lambda d: -d.score)
    return kept + new


def token_logprobs(
    logits: torch.Tensor,  # [n, vocab]: logits[i] predicts targets[i]
    targets: Sequence[int],  # [n]
) -> torch.Tensor:  # [n] float64
    assert logits.shape[0] == len(targets), (logits.shape, len(targets))
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(-1, torch.tensor(list(targets)).unsqueeze(-1)).squeeze(-1)


def dragon_logprobs(
    device_logprobs: torch.Tensor,  # [docs_d, n] log p(x_i | doc, prefix) of the true tokens
    device_relevance: torch.Tensor,  # [docs_d] relevance logits
    cloud_logprobs: torch.Tensor,  # [docs_c, n]
    cloud_relevance: torch.Tensor,  # [docs_c]
) -> torch.Tensor:  # [n] log of the aggregate law at the true tokens
    """log(eta_d p_d(x) + eta_c p_c(x)) per position; a side without documents has weight 0."""
    parts = []
    for logprobs, relevance in (
        (device_logprobs, device_relevance),
        (cloud_logprobs, cloud_relevance),
    ):
        if relevance.numel():
            probs = document_mixture(logprobs.double().exp(), relevance.double())  # [n]
            parts.append((probs, side_logweight(relevance.double())))
    assert parts, "no documents on either side"
    if len(parts) == 1:
        return parts[0][0].log()
    (device_probs, h_d), (cloud_probs, h_c) = parts
    return mixture(device_probs, cloud_probs, h_d, h_c).log()


def joined_logprobs(
    device_logprobs: torch.Tensor,  # [n] log p(x_i | the device's documents joined, prefix)
    device_relevance: torch.Tensor,  # [docs_d] relevance logits of those documents
    cloud_logprobs: torch.Tensor,  # [n]
    cloud_relevance: torch.Tensor,  # [docs_c]
) -> torch.Tensor:  # [n]
    """One row per side (`rows="side"`, `aggregation.joined_side_law`): each side's law is its
    joined row's, its weight h the logsumexp of its documents' relevance logits, as in
    `dragon_logprobs`; both sides must hold documents."""
    return mixture(
        device_logprobs.double().exp(),
        cloud_logprobs.double().exp(),
        side_logweight(device_relevance.double()),
        side_logweight(cloud_relevance.double()),
    ).log()


def perplexity(nll_sum: float, tokens: int) -> float:
    return math.exp(nll_sum / tokens)


# -- scoring with a model --------------------------------------------------------------------


class PassageScorer:
    """Scores one passage under every method, reusing work across k."""

    def __init__(self, lm, passage: Passage, config: QualityConfig):
        self.lm, self.passage, self.config = lm, passage, config
        self.separator = lm.tokenizer.encode(SEPARATOR)
        self._doc_ids: dict[str, list[int]] = {}
        self._row_logprobs: dict[str, torch.Tensor] = {}  # doc id -> [n]

    def doc_ids(self, doc: Doc) -> list[int]:
        if doc.doc_id not in self._doc_ids:
            ids = self.lm.tokenizer.encode(doc.text)[: self.config.doc_tokens]
            self._doc_ids[doc.doc_id] = ids + self.separator
        return self._doc_ids[doc.doc_id]

    def plain(self, context: list[int]) -> torch.Tensor:  # [n]
        """Log-probs of the continuation after context + prefix, one `lm.score` call."""
        prefix, scored = list(self.passage.prefix_ids), list(self.passage.scored_ids)
        logits = self.lm.score(context + prefix + scored[:-1])  # [len, vocab]
        start = len(context) + len(prefix) - 1
        return token_logprobs(logits[start:], scored)

    def row(self, doc: Doc) -> torch.Tensor:  # [n], the per-document row
        if doc.doc_id not in self._row_logprobs:
            self._row_logprobs[doc.doc_id] = self.plain(self.doc_ids(doc))
        return self._row_logprobs[doc.doc_id]

    def relevance(self, docs: list[Doc]) -> torch.Tensor:  # [len(docs)] relevance logits
        temperature = self.config.relevance_temperature
        return torch.tensor([d.score / temperature for d in docs], dtype=torch.float64)

    def dragon(self, device: list[Doc], cloud: list[Doc]) -> torch.Tensor:  # [n]
        if not device and not cloud:
            return self.plain([])

        def stack(docs: list[Doc]) -> tuple[torch.Tensor, torch.Tensor]:
            n = len(self.passage.scored_ids)
            rows = torch.stack([self.row(d) for d in docs]) if docs else torch.zeros(0, n)
            return rows, self.relevance(docs)

        return dragon_logprobs(*stack(device), *stack(cloud))

    def concatenated(self, contexts: list[list[Doc]]) -> list[torch.Tensor]:
        """Log-probs after each context (documents concatenated); the KV cache of the common
        documents is kept from one context to the next (crop + decode the new ones)."""
        prefix, scored = list(self.passage.prefix_ids), list(self.passage.scored_ids)
        out, state, held, held_len = [], None, [], 0
        for docs in contexts:
            if not docs:
                out.append(self.plain([]))
                continue
            common = 0
            while common < min(len(held), len(docs)) and held[common] == docs[common].doc_id:
                common += 1
            keep = sum(len(self.doc_ids(d)) for d in docs[:common])
            new = [t for d in docs[common:] for t in self.doc_ids(d)]
            if state is None or common == 0:
                state = self.lm.prefill(new)
            else:
                self.lm.crop(state, keep)
                if new:
                    self.lm.decode(state, new)
            held, held_len = [d.doc_id for d in docs], keep + len(new)
            block = prefix + scored[:-1]
            logits = self.lm.decode(state, block)[0]  # [len(block), vocab]
            start = len(prefix) - 1
            out.append(token_logprobs(logits[start:], scored))
            self.lm.crop(state, held_len)
        return out


def score_passage(
    lm, passage: Passage, sides: dict[int, tuple[list[Doc], list[Doc]]], config: QualityConfig
) -> PassageResult:
    """NLL sums of the continuation under every method at every k (`sides[k]` = (device docs,
    cloud docs)); k = 0 must map to ([], [])."""
    began = time.perf_counter()
    scorer = PassageScorer(lm, passage, config)
    ks = sorted(sides)
    result = PassageResult(name=passage.name, tokens=len(passage.scored_ids))
    nll = {m: {} for m in METHODS}
    base = -float(scorer.plain([]).sum())
    drcg_docs, previous = [], []
    for k in ks:
        previous = union_order(previous, sides[k][0] + sides[k][1])
        drcg_docs.append(previous)
    rows: dict[str, dict[int, torch.Tensor]] = {}  # the concatenated rows' log-probs
    for method, contexts in (
        ("crcg-device", [sides[k][0] for k in ks]),
        ("crcg-cloud", [sides[k][1] for k in ks]),
        ("drcg", drcg_docs),
    ):
        rows[method] = dict(zip(ks, scorer.concatenated(contexts), strict=True))
        for k, logprobs in rows[method].items():
            nll[method][k] = -float(logprobs.sum())
    for k in ks:
        nll["none"][k] = base
        nll["dragon"][k] = -float(scorer.dragon(*sides[k]).sum())
        device, cloud = sides[k]
        if device and cloud:
            joined = joined_logprobs(rows["crcg-device"][k], scorer.relevance(device),
                                     rows["crcg-cloud"][k], scorer.relevance(cloud))  # fmt: skip
            nll["dragon-side"][k] = -float(joined.sum())
        else:  # one side holds documents: its row alone (the other has weight 0)
            nll["dragon-side"][k] = nll["crcg-device" if device else "crcg-cloud"][k]
    result.nll, result.seconds = nll, time.perf_counter() - began
    return result


def summarize(results: list[PassageResult], ks: Sequence[int]) -> dict:
    """Corpus-level perplexity per method and k, and DRAGON's gain over the best baseline."""
    tokens = sum(r.tokens for r in results)
    ppl = {
        m: {k: perplexity(sum(r.nll[m][k] for r in results), tokens) for k in ks} for m in METHODS
    }
    base = ppl["none"][ks[0]]
    gains = {}
    for k in ks:
        if k == 0:
            continue
        best = max(base - ppl[m][k] for m in ("crcg-device", "crcg-cloud", "drcg"))
        gains[k] = {
            "dragon_gain": base - ppl["dragon"][k],
            "dragon_side_gain": base - ppl["dragon-side"][k],
            "best_baseline_gain": best,
            "ratio": (base - ppl["dragon"][k]) / best if best > 0 else None,
        }
    wins = {
        k: {m: sum(r.nll["dragon"][k] < r.nll[m][k] for r in results) for m in METHODS[1:4]}
        for k in ks
        if k
    }  # paired: passages on which DRAGON's NLL is lower than each context-aggregation method's
    return {
        "perplexity": ppl,
        "gain_over_none": gains,
        "dragon_wins": wins,
        "scored_tokens": tokens,
    }


# -- the offline data set ----------------------------------------------------------------------


def stdlib_passages(tokenizer, config: QualityConfig) -> list[Passage]:
    """`config.passages` held-out windows, evenly spaced over all test-part windows."""
    from tandem.retrieval.stdlib import eval_windows, split_by_package, stdlib_documents

    _, test_docs = split_by_package(stdlib_documents(), test_fraction=config.test_fraction)
    width = config.prefix_tokens + config.scored_tokens
    windows = eval_windows(test_docs, tokenizer, window_tokens=width)
    if not windows:
        raise ValueError("no held-out windows")
    picks = np.linspace(0, len(windows) - 1, min(config.passages, len(windows))).round()
    return [
        Passage(
            name=f"{windows[i].package}#{i}",
            prefix_ids=windows[i].ids[: config.prefix_tokens],
            scored_ids=windows[i].ids[config.prefix_tokens :],
        )
        for i in sorted({int(p) for p in picks})
    ]


def package_of(doc_id: str) -> str:
    """'stdlib:email.message.Message' -> 'email'."""
    return doc_id.split(":", 1)[-1].split(".")[0]


def device_half(doc: Doc) -> bool:
    """The "module" split: a package's documents live on the device iff its hash is even."""
    from tandem.retrieval.stdlib import in_test_part

    return in_test_part(package_of(doc.doc_id), 0.5, salt="tandem-dragon-sides")


def retrieve(retriever, queries: list[str], config: QualityConfig) -> list[list[Doc]]:
    """Ranked hits per query from the retrieval part only (test-part packages dropped)."""
    from tandem.retrieval.stdlib import in_test_part

    depth = 4 * max(config.ks) + 32
    out = []
    for hits in retriever.search_many(queries, depth):
        docs = [
            Doc(f"{c.doc_id}#{c.position}", c.text, s)
            for c, s in hits
            if not in_test_part(package_of(c.doc_id), config.test_fraction)
        ]
        out.append(docs)
    return out


def stdlib_retriever():
    """The cached stdlib index (Qwen-tokenizer 64-token chunks, MiniLM), built on first use."""
    from tandem.models.registry import load_tokenizer
    from tandem.protocols.dragon.setup import ensure_index
    from tandem.retrieval.index import open_index

    name = "qwen2.5-coder-0.5b"
    path = ensure_index("stdlib", tokenizer=load_tokenizer(name), tokenizer_name=name)
    return open_index(path)


# -- the benchmark ------------------------------------------------------------------------------


def run(
    *, model: str, out: Path, config: QualityConfig, progress: bool = True, name="dragon_quality"
) -> dict:
    """Score `config.passages` held-out passages under every method and k; JSON + PNG."""
    from rich.console import Console
    from rich.progress import Progress

    from benchmarks.report import save_json
    from tandem.models.registry import load_model
    from tandem.testbed.cpus import machine_state

    if config.split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}")
    machine = {"before": machine_state()}  # cpu set, threads, load average; "after" below
    console = Console()
    lm = load_model(model, progress=progress)
    passages = stdlib_passages(lm.tokenizer, config)
    retriever = stdlib_retriever()
    queries = [lm.tokenizer.decode(list(p.prefix_ids)) for p in passages]
    hits = retrieve(retriever, queries, config)
    lm.score(list(passages[0].prefix_ids))  # warm-up, discarded
    results: list[PassageResult] = []
    with Progress(disable=not progress, console=console) as bar:
        task = bar.add_task("passages", total=len(passages))
        for passage, ranked in zip(passages, hits, strict=True):
            sides = {k: side_docs(ranked, k, config.split, device_half) for k in config.ks}
            results.append(score_passage(lm, passage, sides, config))
            bar.console.log(f"{passage.name}: {results[-1].seconds:.1f} s")
            bar.advance(task)
    summary = summarize(results, config.ks)
    machine["after"] = machine_state(lm)
    payload = {
        "figure": "DRAGON Fig. 5 (perplexity vs retrieved documents per side)",
        "model": model,
        "machine": machine,
        "config": asdict(config),
        "data": {
            "corpus": "stdlib docstrings (tandem.retrieval.stdlib), 64-token chunks, MiniLM flat "
            "index; chunks of held-out packages removed from every hit list",
            "held_out": "eval_windows over the test part of split_by_package (whole packages, "
            f"test_fraction {config.test_fraction}), {len(passages)} windows of "
            f"{config.prefix_tokens}+{config.scored_tokens} tokens evenly spaced over all",
            "query": "the decoded prefix",
            "doc_tokens": config.doc_tokens,
            "split": config.split,
            "context_budget": "none (all 2k documents always fit)",
            "relevance": "static: cosine / relevance_temperature (no dynamic re-scoring)",
            "codec": "identity (the transmitted law equals the side law)",
        },
        "perplexity": {
            m: {str(k): v for k, v in row.items()} for m, row in summary["perplexity"].items()
        },
        "gain_over_none": {str(k): v for k, v in summary["gain_over_none"].items()},
        "dragon_wins_of_passages": {str(k): v for k, v in summary["dragon_wins"].items()},
        "scored_tokens": summary["scored_tokens"],
        "passages": [
            {
                "name": r.name,
                "seconds": r.seconds,
                "tokens": r.tokens,
                "nll": {m: {str(k): v for k, v in row.items()} for m, row in r.nll.items()},
            }
            for r in results
        ],  # fmt: skip
        "model_seconds": sum(r.seconds for r in results),
        "paper": PAPER,
    }
    save_json(out, name, payload)
    plot(summary, config, model, out, name)
    _print(console, summary, config)
    return payload


LABELS = {
    "none": "w/o retrieval",
    "crcg-cloud": "CRCG/Cloud",
    "crcg-device": "CRCG/Device",
    "drcg": "DRCG",
    "dragon": "DRAGON",
    "dragon-side": "DRAGON, one row per side (ours)",
}


def plot(summary: dict, config: QualityConfig, model: str, out: Path, name: str) -> Path:
    from benchmarks.report import new_figure, save_png

    fig, axes = new_figure()
    ax = axes[0][0]
    for method in METHODS:
        ys = [summary["perplexity"][method][k] for k in config.ks]
        ax.plot(config.ks, ys, marker="o", linestyle="--" if method == "none" else "-",
                label=LABELS[method])  # fmt: skip
    ax.set_xlabel("retrieved documents per side (k)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"{model}, stdlib held-out ({config.split} split)", fontsize=9)
    ax.legend(fontsize=8)
    return save_png(fig, out, name)


def _print(console, summary: dict, config: QualityConfig) -> None:
    from rich.table import Table

    table = Table("method", *(f"k={k}" for k in config.ks))
    for method in METHODS:
        table.add_row(
            LABELS[method], *(f"{summary['perplexity'][method][k]:.3f}" for k in config.ks)
        )
    console.print(table)
