"""Index folders: build, add to, and open them. Every write is atomic.

Why one file: build, add and open share one on-disk format (the manifest's fields, the
atomic write, the checks on open); split, its invariants would be spread over modules.

An index folder holds three files:
- `manifest.json`: what the index was built with (embedder name and dim, tokenizer name and
  fingerprint, chunk parameters, index kind) and counts (documents, chunks, tokens);
- `index.faiss`: the vectors (faiss's own format), vector id = docstore row;
- `docstore.sqlite`: the chunks (text, source, offsets, metadata), see `docstore`.

Words used here:
- *reuse*: a chunk whose key (text + chunk parameters + tokenizer) is already in the old index
  takes its vector from there instead of being embedded again (incremental builds).
- *atomic write*: the new folder is written next to the target under a temporary name and
  renamed into place; on any failure the temporary folder is removed and the old index (if
  any) stays as it was. (Replacing an existing index is two renames; a crash between them
  leaves the old one as `.<name>.old-*` beside it.)
- *compatible*: an index is only searched or extended with the embedder and tokenizer it was
  built with; anything else is refused with a one-line `TandemError`. `build` into an index
  of another embedder or tokenizer is refused too, unless asked to `replace` it.
- *unreadable*: a truncated, corrupt or missing `index.faiss` or `docstore.sqlite` is a
  one-line `TandemError` naming the file and giving the exact `tandem index build` command that
  makes the index again (never a faiss/SQLite traceback); `build` over such an index of the
  same embedder and tokenizer simply rebuilds it (nothing to reuse).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tandem.errors import TandemError
from tandem.models.base import Tokenizer
from tandem.retrieval.chunking import Chunk, ChunkParams, TokenCounter, chunk_document
from tandem.retrieval.corpus import SkipHandler, log_skip, read_sources
from tandem.retrieval.docstore import REBUILD_HINT, DocStore, unreadable, write_docstore
from tandem.retrieval.embedder import Embedder, load_embedder
from tandem.retrieval.search import Retriever, index_vectors, make_faiss_index

log = logging.getLogger("tandem.retrieval")

FORMAT = "tandem-index-1"
MANIFEST, FAISS_FILE, DOCSTORE_FILE = "manifest.json", "index.faiss", "docstore.sqlite"
EMBED_BATCH = 64


@dataclass(frozen=True, kw_only=True)
class Manifest:
    embedder: str
    dim: int
    tokenizer: str
    tokenizer_fingerprint: str
    chunk_tokens: int
    overlap: int
    index_kind: str
    documents: int
    chunks: int
    tokens: int
    sources: tuple[str, ...] = ()
    format: str = FORMAT

    @property
    def params(self) -> ChunkParams:
        return ChunkParams(chunk_tokens=self.chunk_tokens, overlap=self.overlap)


@dataclass(frozen=True, kw_only=True)
class BuildReport:
    path: Path
    manifest: Manifest
    embedded: int  # chunks whose vectors were computed now
    reused: int  # chunks whose vectors came from the previous index
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (path, reason)
    seconds: float = 0.0
    bytes: int = 0  # size of the index folder


def read_manifest(path: Path) -> Manifest:
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise TandemError(f"'{path}' is not a tandem index (no {MANIFEST})")
    try:
        data = json.loads(file.read_text())
        if data.get("format") != FORMAT:
            raise TandemError(f"'{path}': index format {data.get('format')!r}, expected {FORMAT}")
        data["sources"] = tuple(data.get("sources", ()))
        return Manifest(**data)
    except (json.JSONDecodeError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise TandemError(
            f"'{path}': unreadable {MANIFEST} ({exc}); rebuild it: tandem index build SOURCES "
            f"--out {shlex.quote(str(path))} --replace"
        ) from exc


def rebuild_command(path: Path, manifest: Manifest) -> str:
    """The `tandem index build` command line that makes the index at `path` again (its
    sources as they were given when it was built)."""
    args = ["tandem", "index", "build", *(manifest.sources or ["SOURCES"]), "--out", str(path)]
    args += ["--tokenizer", manifest.tokenizer, "--embedder", manifest.embedder]
    args += ["--chunk-tokens", str(manifest.chunk_tokens)]
    if manifest.overlap:
        args += ["--overlap", str(manifest.overlap)]
    if manifest.index_kind != "flat":
        args += ["--index", manifest.index_kind]
    return shlex.join(args)


def check_compatible(
    manifest: Manifest, *, embedder: str | None = None, tokenizer: str | None = None
) -> None:
    """Refuse another embedder (by name) or tokenizer (by fingerprint)."""
    if embedder is not None and embedder != manifest.embedder:
        raise TandemError(f"index was built with embedder '{manifest.embedder}', not '{embedder}'")
    if tokenizer is not None and tokenizer != manifest.tokenizer_fingerprint:
        raise TandemError(
            f"index was built with tokenizer '{manifest.tokenizer}' "
            f"({manifest.tokenizer_fingerprint[:12]}), not this one ({tokenizer[:12]})"
        )


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def _write_atomic(out: Path, chunks: list[Chunk], vectors: np.ndarray, manifest: Manifest) -> None:
    """Write the three files into a temporary sibling folder, then rename it to `out`."""
    import faiss

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        work.chmod(0o755)  # mkdtemp makes it private; an index folder is an ordinary folder
        faiss.write_index(make_faiss_index(manifest.index_kind, vectors), str(work / FAISS_FILE))
        write_docstore(work / DOCSTORE_FILE, chunks)
        blob = json.dumps(asdict(manifest), indent=2, sort_keys=True)
        (work / MANIFEST).write_text(blob + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(work, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _previous_manifest(
    out: Path, *, embedder: Embedder, tokenizer: Tokenizer, tokenizer_name: str, replace: bool
) -> Manifest | None:
    """The manifest of the index a build would overwrite (None if there is none, or if it is
    unreadable and `replace`); an index of another embedder or tokenizer is refused unless
    `replace`."""
    if not (out / MANIFEST).is_file():
        return None
    hint = "use another --out, or --replace to overwrite it"
    try:
        old = read_manifest(out)
    except TandemError as exc:
        if replace:
            return None
        raise TandemError(f"{exc}; {hint}") from exc
    same = old.embedder == embedder.name and old.tokenizer_fingerprint == tokenizer.fingerprint
    if not same and not replace:
        raise TandemError(
            f"{out} was built with embedder '{old.embedder}' and tokenizer '{old.tokenizer}' "
            f"({old.tokenizer_fingerprint[:12]}); this build asks for embedder "
            f"'{embedder.name}' and tokenizer '{tokenizer_name}' ({tokenizer.fingerprint[:12]}): "
            f"{hint}"
        )
    return old


def _existing_vectors(
    out: Path, embedder: Embedder, previous: Manifest | None
) -> dict[str, np.ndarray]:
    """key -> vector of the index already at `out` if the same embedder made it and it can be
    read (else empty: an unreadable old index is rebuilt from scratch)."""
    if previous is None or previous.embedder != embedder.name:
        return {}
    try:
        retriever = open_index(out, embedder=embedder)
        keys = [c.key for c in retriever.lookup.all()]
        vectors = index_vectors(retriever.index)
        retriever.lookup.close()
    except TandemError:
        return {}
    if len(keys) != len(vectors):
        return {}
    return dict(zip(keys, vectors, strict=True))


def _embed(
    chunks: list[Chunk], embedder: Embedder, known: dict[str, np.ndarray], progress: Any
) -> tuple[np.ndarray, int]:
    """Vectors [len(chunks), dim] by chunk, embedding only unknown keys; returns (vectors, n embedded)."""
    todo = list(dict.fromkeys(c.key for c in chunks if c.key not in known))
    text_of = {c.key: c.text for c in chunks}
    fresh: dict[str, np.ndarray] = {}
    task = progress.add_task("embedding", total=len(todo))
    for start in range(0, len(todo), EMBED_BATCH):
        batch = todo[start : start + EMBED_BATCH]
        fresh.update(zip(batch, embedder.embed([text_of[k] for k in batch]), strict=True))
        progress.advance(task, len(batch))
    vectors = [fresh[c.key] if c.key in fresh else known[c.key] for c in chunks]
    stacked = (
        np.stack(vectors).astype(np.float32) if vectors else np.zeros((0, embedder.dim), np.float32)
    )
    return stacked, len(todo)


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=True,
    )


def _collect(
    sources: list[str | Path],
    tokenizer: Tokenizer,
    params: ChunkParams,
    progress: Any,
    on_skip: SkipHandler,
) -> tuple[list[Chunk], int]:
    """(chunks of all documents of all sources, number of documents)."""
    skipped: list[str] = []

    def skip(where: str, reason: str) -> None:
        skipped.append(where)
        on_skip(where, reason)

    docs = read_sources(sources, skip)
    if not docs:
        why = f" ({len(skipped)} skipped: unreadable, binary or not UTF-8)" if skipped else ""
        raise TandemError(
            f"no text documents found in {', '.join(map(str, sources))}{why}: nothing to index"
        )
    count = TokenCounter(tokenizer)
    task = progress.add_task("chunking", total=len(docs))
    chunks = []
    for doc in docs:
        chunks.extend(chunk_document(doc, tokenizer, params, count=count))
        progress.advance(task)
    return chunks, len(docs)


def build_index(
    sources: list[str | Path],
    out: Path,
    *,
    tokenizer: Tokenizer,
    tokenizer_name: str,
    embedder: Embedder,
    params: ChunkParams,
    kind: str = "flat",
    progress: bool = False,
    on_skip: SkipHandler = log_skip,
    replace: bool = False,
) -> BuildReport:
    """Index exactly `sources` into `out`, reusing vectors of unchanged chunks already there.
    An index at `out` made with another embedder or tokenizer is refused unless `replace`."""
    began = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TandemError(f"--out '{out}' is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise TandemError(f"--out '{out}' is a non-empty folder that is not a tandem index")
    make_faiss_index(kind, np.zeros((0, 1), np.float32))  # validate the kind before any work
    previous = _previous_manifest(
        out, embedder=embedder, tokenizer=tokenizer, tokenizer_name=tokenizer_name, replace=replace
    )
    skipped: list[tuple[str, str]] = []

    def skip(path: str, reason: str) -> None:
        skipped.append((path, reason))
        on_skip(path, reason)

    with _progress(progress) as bar:
        chunks, documents = _collect(sources, tokenizer, params, bar, skip)
        known = _existing_vectors(out, embedder, previous)
        vectors, embedded = _embed(chunks, embedder, known, bar)
    manifest = Manifest(
        embedder=embedder.name,
        dim=embedder.dim,
        tokenizer=tokenizer_name,
        tokenizer_fingerprint=tokenizer.fingerprint,
        chunk_tokens=params.chunk_tokens,
        overlap=params.overlap,
        index_kind=kind,
        documents=documents,
        chunks=len(chunks),
        tokens=sum(c.n_tokens for c in chunks),
        sources=tuple(str(s) for s in sources),
    )
    _write_atomic(out, chunks, vectors, manifest)
    return BuildReport(
        path=out,
        manifest=manifest,
        embedded=embedded,
        reused=len(chunks) - embedded,
        skipped=tuple(skipped),
        seconds=time.perf_counter() - began,
        bytes=folder_bytes(out),
    )


def add_to_index(
    path: Path,
    sources: list[str | Path],
    *,
    tokenizer: Tokenizer | None = None,
    embedder: Embedder | None = None,
    progress: bool = False,
    on_skip: SkipHandler = log_skip,
) -> BuildReport:
    """Add the documents of `sources` to an index; a document whose id is already there is
    replaced. Existing and unchanged chunks are not embedded again."""
    began = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    tokenizer = tokenizer or load_tokenizer(manifest.tokenizer)
    check_compatible(manifest, tokenizer=tokenizer.fingerprint)
    retriever = open_index(path, embedder=embedder)
    old_chunks = retriever.lookup.all()
    known = dict(zip((c.key for c in old_chunks), index_vectors(retriever.index), strict=True))
    skipped: list[tuple[str, str]] = []

    def skip(where: str, reason: str) -> None:
        skipped.append((where, reason))
        on_skip(where, reason)

    with _progress(progress) as bar:
        new_chunks, _ = _collect(sources, tokenizer, manifest.params, bar, skip)
        replaced = {c.doc_id for c in new_chunks}
        chunks = [c for c in old_chunks if c.doc_id not in replaced] + new_chunks
        vectors, embedded = _embed(chunks, retriever.embedder, known, bar)
    retriever.lookup.close()
    updated = Manifest(
        **{
            **asdict(manifest),
            "documents": len({c.doc_id for c in chunks}),
            "chunks": len(chunks),
            "tokens": sum(c.n_tokens for c in chunks),
            "sources": tuple(dict.fromkeys([*manifest.sources, *map(str, sources)])),
        },
    )
    _write_atomic(path, chunks, vectors, updated)
    return BuildReport(
        path=path,
        manifest=updated,
        embedded=embedded,
        reused=len(chunks) - embedded,
        skipped=tuple(skipped),
        seconds=time.perf_counter() - began,
        bytes=folder_bytes(path),
    )


def faiss_reason(message: str) -> str:
    """A short reason from a faiss RuntimeError ("Error in <fn> at <file>.cpp:<line>: ...")."""
    message = " ".join(message.split())
    short_read = re.search(r"read error in .*: (\d+) != (\d+)", message)
    if short_read:
        return f"truncated: read {short_read[1]} of {short_read[2]} bytes"
    tail = re.split(r"\.cpp:\d+: ", message)[-1]
    return re.sub(r"^Error: '.*?' failed: ", "", tail) or "faiss could not read it"


def read_faiss(file: Path, hint: str = REBUILD_HINT) -> Any:
    """faiss.read_index, with a one-line `TandemError` for a missing, truncated or corrupt file."""
    import faiss

    if not Path(file).is_file():
        raise unreadable(file, None, hint)
    try:
        return faiss.read_index(str(file))
    except RuntimeError as exc:
        raise unreadable(file, faiss_reason(str(exc)), hint) from exc


# an index written before chunks kept their lead (docs/retrieval.md "Joined contexts")
NO_LEADS = (
    "built before chunks kept the whitespace before them, so a joined context starts each "
    "chunk on a new line"
)
_WARNED_NO_LEADS: set[str] = set()  # index folders named once a process


def rebuild_hint(path: Path, manifest: Manifest) -> str:
    """What an error or warning about an index folder ends with: the command that rebuilds it."""
    return f"rebuild it: {rebuild_command(path, manifest)}"


def _open_files(path: Path, manifest: Manifest) -> tuple[Any, DocStore]:
    """(faiss index, docstore) of an index folder, checked against each other and the manifest."""
    hint = rebuild_hint(path, manifest)
    index = read_faiss(path / FAISS_FILE, hint)
    if manifest.index_kind == "hnsw":
        index.hnsw.efSearch = max(index.hnsw.efSearch, 64)
    store = DocStore(path / DOCSTORE_FILE, hint=hint)
    if not index.ntotal == len(store) == manifest.chunks:
        store.close()
        raise TandemError(
            f"{path}: index is corrupt: {index.ntotal} vectors, {len(store)} chunks, manifest "
            f"says {manifest.chunks}; {hint}"
        )
    if not store.has_leads and str(path) not in _WARNED_NO_LEADS:
        _WARNED_NO_LEADS.add(str(path))
        log.warning("%s: %s; to join them as the documents do, %s", path, NO_LEADS, hint)
    return index, store


def check_index(path: Path) -> Manifest:
    """Read an index folder's three files and check they agree, without loading its embedder;
    a one-line `TandemError` naming the file at fault if not."""
    manifest = read_manifest(Path(path))
    _open_files(Path(path), manifest)[1].close()
    return manifest


def open_index(
    path: Path, *, embedder: Embedder | None = None, tokenizer: Tokenizer | None = None
) -> Retriever:
    """A `Retriever` over an index folder; loads the manifest's embedder unless one is given."""
    path = Path(path)
    manifest = read_manifest(path)
    check_compatible(
        manifest,
        embedder=embedder.name if embedder is not None else None,
        tokenizer=tokenizer.fingerprint if tokenizer is not None else None,
    )
    index, store = _open_files(path, manifest)
    embedder = embedder or load_embedder(manifest.embedder)
    return Retriever(index=index, lookup=store, embedder=embedder, manifest=manifest)


def load_tokenizer(name: str) -> Tokenizer:
    """The tokenizer of a named model (through the model registry)."""
    from tandem.models.registry import load_tokenizer as registry_load_tokenizer

    return registry_load_tokenizer(name)
