"""A DRAGON side, ready to run: its model, its knowledge (index + document-KV store) and its
offline decode-latency profile, loaded from a corpus name; the handshake settings of a side.

Words used here:
- *corpus*: a folder of documents, `stdlib` (the public corpus), or an index folder made by
  `tandem index build`. Folders are indexed once into `$TANDEM_HOME/indexes/` (64-token
  chunks, MiniLM embeddings, with a progress bar) and reused afterwards.
- *secret*: the shared HMAC key of the transport handshake, read from `$TANDEM_SECRET`
  (never from argv, which other users can read).

Used by the serving layer (`tandem.serve.dragon_session`, the device API), the baselines and
the benchmarks alike.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tandem.config import tandem_home
from tandem.errors import TandemError

CHUNK_TOKENS = 64  # DRAGON's document size (paper Sec. 7.3)
EMBEDDER = "all-minilm-l6-v2"
# The cache's chunk layout: "leads" since chunks carry the whitespace before them
# (`Chunk.lead`); a new tag builds the cached indexes once more so joined contexts get it.
LAYOUT = "leads"


def set_threads(threads: int | None, role: str | None = None) -> None:
    """Threads for this process. 0/None with a role: pin the process to that role's cores
    (device = first half of the machine, cloud = second half; engines use one thread per
    core); otherwise `threads` torch threads (default: half the cores), unpinned."""
    import torch

    if not threads and role is not None:
        from tandem.testbed.cpus import pin_role

        pin_role(role)
        return
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))


def ensure_index(corpus: str, *, tokenizer, tokenizer_name: str, progress: bool = True) -> Path:
    """An index folder for `corpus`, built into the cache on first use (and again if the cached
    one is damaged); files of a folder that cannot be read are skipped with a warning."""
    from tandem.retrieval.chunking import ChunkParams
    from tandem.retrieval.embedder import load_embedder
    from tandem.retrieval.index import MANIFEST, build_index, check_index

    if corpus != "stdlib":
        path = Path(corpus).expanduser()
        if (path / MANIFEST).is_file():
            return path
        if not path.exists():
            raise TandemError(f"corpus {corpus!r} not found (a folder, an index or 'stdlib')")
        corpus = str(path.resolve())
    tag = f"{corpus}:{CHUNK_TOKENS}:{tokenizer.fingerprint}:{EMBEDDER}:{LAYOUT}"
    name = f"{Path(corpus).name}-{hashlib.sha256(tag.encode()).hexdigest()[:12]}"
    out = tandem_home() / "indexes" / name
    if out.exists():
        try:
            check_index(out)
            return out
        except TandemError as exc:
            damage = str(exc).split("; rebuild it")[0]
            print(f"the cached index is damaged ({damage}); rebuilding it", file=sys.stderr)
            shutil.rmtree(out, ignore_errors=True)
    elif progress:
        print(f"indexing {corpus} into {out} (first run only)", file=sys.stderr)

    def warn(path: str, reason: str) -> None:
        if corpus != "stdlib":  # the stdlib's own odd modules are not the user's business
            print(f"skipped {path}: {reason}", file=sys.stderr)

    build_index(
        [corpus],
        out,
        tokenizer=tokenizer,
        tokenizer_name=tokenizer_name,
        embedder=load_embedder(EMBEDDER),
        params=ChunkParams(chunk_tokens=CHUNK_TOKENS),
        progress=progress,
        on_skip=warn,
        replace=True,  # the cache's own folder: its name holds the tokenizer and embedder
    )
    return out


@dataclass
class SideSetup:
    """A loaded side: model, knowledge (index + doc KV store) and its offline profile."""

    lm: object
    knowledge: object
    profile: object | None


def load_side(
    *,
    corpus: str,
    model: str,
    docs: int,
    profile: bool = True,
    progress: bool = True,
    lm=None,
) -> SideSetup:
    """Load (or reuse `lm`), index the corpus if needed, and profile decode latency."""
    from tandem.models.registry import load_model
    from tandem.protocols.dragon import Knowledge
    from tandem.protocols.dragon.profiler import cached_profile

    lm = lm if lm is not None else load_model(model, progress=progress)
    index = ensure_index(corpus, tokenizer=lm.tokenizer, tokenizer_name=model, progress=progress)
    knowledge = Knowledge.from_index(index, kv_root=tandem_home() / "kv", lm=lm)
    latency = None
    if profile:
        latency = cached_profile(lm, batch=max(docs, 1), cache_dir=tandem_home() / "profiles")
    return SideSetup(lm=lm, knowledge=knowledge, profile=latency)


def transport_config(lm, *, role: str, link=None, secret: bytes | None = None):
    """Handshake settings; the secret defaults to `$TANDEM_SECRET` (None: no auth)."""
    from tandem.transport import TransportConfig

    if secret is None and os.environ.get("TANDEM_SECRET"):
        secret = os.environ["TANDEM_SECRET"].encode()
    return TransportConfig.for_model(
        lm,
        role=role,
        secret=secret,
        ping_interval=1.0,
        dead_peer_timeout=5.0,
        link=link,
    )
