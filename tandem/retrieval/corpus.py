"""Documents and where they come from: local folders, JSONL files, and the stdlib corpus.

Words used here:
- *document*: one unit of text a corpus holds (a file, a JSONL record, one docstring), with a
  stable `doc_id`, the `source` it came from and free-form `meta`. Chunking cuts documents.
- *source*: what a user names on the command line: a folder, a `.jsonl` file, or the special
  name `stdlib` (the Python standard library's docstrings, see `tandem.retrieval.stdlib`).
- *skip*: a file that is not read (binary, not UTF-8, unreadable, too large); each skip is
  reported to an `on_skip(path, reason)` callback and logged as a warning, never raised.

Order is deterministic (sorted paths), so two builds of the same folder give the same index.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from tandem.errors import TandemError
from tandem.retrieval.document import Document

log = logging.getLogger("tandem.retrieval")

SkipHandler = Callable[[str, str], None]

MAX_FILE_BYTES = 4 << 20  # larger files are skipped: they are data, not notes or code
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", ".git", ".hg", ".svn", ".venv", "venv"})


def log_skip(path: str, reason: str) -> None:
    """Default skip handler: a logged warning."""
    log.warning("skipped %s: %s", path, reason)


def read_text_file(path: Path) -> tuple[str | None, str]:
    """(text, "") for a readable UTF-8 text file, else (None, reason)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return None, f"larger than {MAX_FILE_BYTES >> 20} MiB"
        data = path.read_bytes()
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if b"\x00" in data[:8192]:
        return None, "binary file"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, "not UTF-8 text"


def read_folder(root: Path, on_skip: SkipHandler = log_skip) -> Iterator[Document]:
    """Every text file under `root` (hidden and cache folders skipped), in sorted path order.

    doc_id is `<folder name>/<relative path>`; empty or whitespace-only files give nothing.
    """
    root = Path(root)
    if not root.is_dir():
        raise TandemError(f"source '{root}' is not a folder")

    def on_error(exc: OSError) -> None:
        on_skip(str(exc.filename), "unreadable folder")

    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if not path.is_file():  # broken link, FIFO, socket, device
                on_skip(str(path), "not a regular file")
                continue
            text, reason = read_text_file(path)
            if text is None:
                on_skip(str(path), reason)
                continue
            if text.strip():
                yield Document(
                    doc_id=f"{root.resolve().name}/{rel}",
                    text=text,
                    source=str(root),
                    meta={"path": rel, "suffix": path.suffix.lower()},
                )


def read_jsonl(path: Path, on_skip: SkipHandler = log_skip) -> Iterator[Document]:
    """Records `{"id": ..., "text": ..., "meta": {...}}`, one a line; bad lines are skipped."""
    text, reason = read_text_file(Path(path))
    if text is None:
        raise TandemError(f"cannot read '{path}': {reason}")
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            on_skip(where, f"not JSON ({exc.msg})")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            on_skip(where, "record has no string 'text'")
            continue
        doc_id = str(record.get("id", f"{Path(path).name}:{number}"))
        if doc_id in seen:
            on_skip(where, f"duplicate id '{doc_id}'")
            continue
        seen.add(doc_id)
        meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
        if record["text"].strip():
            yield Document(doc_id=doc_id, text=record["text"], source=str(path), meta=meta)


def read_source(source: str | Path, on_skip: SkipHandler = log_skip) -> Iterator[Document]:
    """Documents of one source: `stdlib`, a `.jsonl` file, or a folder."""
    if str(source) == "stdlib":
        from tandem.retrieval.stdlib import stdlib_documents

        yield from stdlib_documents()
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise TandemError(f"source '{source}' does not exist")
    if path.is_file() and path.suffix.lower() in (".jsonl", ".ndjson"):
        yield from read_jsonl(path, on_skip)
    elif path.is_dir():
        yield from read_folder(path, on_skip)
    else:
        raise TandemError(f"source '{source}' is neither a folder, a .jsonl file nor 'stdlib'")


def read_sources(sources: list[str | Path], on_skip: SkipHandler = log_skip) -> list[Document]:
    """All documents of all sources; a doc_id seen twice keeps its first document."""
    docs: dict[str, Document] = {}
    for source in sources:
        for doc in read_source(source, on_skip):
            if doc.doc_id in docs:
                on_skip(doc.doc_id, "duplicate document id (kept the first)")
                continue
            docs[doc.doc_id] = doc
    return list(docs.values())
