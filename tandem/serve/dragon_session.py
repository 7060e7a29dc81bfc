"""DRAGON as real processes: a cloud server and a device client over TCP.

Words used here:
- *corpus*: a folder of documents, `stdlib` (the public corpus), or an index folder made by
  `tandem index build`. Folders are indexed once into `$TANDEM_HOME/indexes/` (64-token
  chunks, MiniLM embeddings, with a progress bar) and reused afterwards.
- *ready file*: JSON `{"host", "port", "pid"}` the cloud writes once it listens, so a parent
  process (`tandem demo`) can connect without parsing logs.
- *secret*: the shared HMAC key of the transport handshake, read from `$TANDEM_SECRET`
  (never from argv, which other users can read).

    python -m tandem.serve.dragon_session --corpus stdlib --model qwen2.5-coder-0.5b \
        --listen 127.0.0.1:0 --ready-file /tmp/cloud.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from tandem.errors import TandemError

CHUNK_TOKENS = 64  # DRAGON's document size (paper Sec. 7.3)
EMBEDDER = "all-minilm-l6-v2"


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
    from tandem.models.registry import tandem_home
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
    tag = f"{corpus}:{CHUNK_TOKENS}:{tokenizer.fingerprint}:{EMBEDDER}"
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
    from tandem.models.registry import load_model, tandem_home
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


def emulated_link(delay_ms: float):
    """One direction of an emulated link: `delay_ms` one-way, jitter 1/5 of it (paper 7.3)."""
    from tandem.transport import LinkConfig

    return LinkConfig(delay_ms=delay_ms, jitter_ms=delay_ms / 5) if delay_ms > 0 else None


async def serve_cloud_forever(
    setup: SideSetup, host: str, port: int, *, ready_file: Path | None = None, link=None
) -> None:
    """Listen and serve DRAGON sessions until SIGTERM / SIGINT."""
    from tandem.protocols.dragon import start_cloud

    server = await start_cloud(
        host,
        port,
        lm=setup.lm,
        knowledge=setup.knowledge,
        transport=transport_config(setup.lm, role="cloud", link=link),
        profile=setup.profile,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    info = {"host": server.host, "port": server.port, "pid": os.getpid()}
    if ready_file is not None:
        partial = ready_file.with_name(ready_file.name + ".partial")
        partial.write_text(json.dumps(info))
        partial.replace(ready_file)
    print(f"dragon cloud listening on {server.host}:{server.port}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()


async def run_device_session(
    setup: SideSetup,
    host: str,
    port: int,
    *,
    question: str,
    config,
    on_token=None,
    link=None,
    secret: bytes | None = None,
):
    """Connect to a DRAGON cloud and generate; returns the device's `SideReport`."""
    from tandem.protocols.dragon import connect_device

    return await connect_device(
        host,
        port,
        transport=transport_config(setup.lm, role="device", link=link, secret=secret),
        lm=setup.lm,
        knowledge=setup.knowledge,
        question=question,
        config=config,
        profile=setup.profile,
        on_token=on_token,
    )


def cloud_main(argv: list[str] | None = None) -> None:
    """Entry point of a cloud process (used by `tandem demo`)."""
    from tandem.transport.proxy import parse_hostport

    parser = argparse.ArgumentParser(prog="python -m tandem.serve.dragon_session")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--role", default="cloud", help="cores to pin to when --threads is 0")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="emulated one-way delay")
    args = parser.parse_args(argv)
    try:
        set_threads(args.threads, role=args.role)
        host, port = parse_hostport(args.listen)
        setup = load_side(
            corpus=args.corpus, model=args.model, docs=args.docs, profile=not args.no_profile
        )
        link = emulated_link(args.delay_ms)
        asyncio.run(serve_cloud_forever(setup, host, port, ready_file=args.ready_file, link=link))
    except TandemError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cloud_main()
