"""The SQLite docstore of an index: one row per chunk, row number = faiss vector id.

Words used here:
- *row*: a chunk's position in the index (0..n-1); the faiss index holds the chunk's vector
  under the same number, so a search hit's id is a row here.
- *meta*: a document's metadata, stored as JSON text (never pickled).
- *unreadable*: a file SQLite rejects (not a database, truncated, no `chunks` table); every
  read turns that into a one-line `TandemError` naming the file and ending with a *hint*, what
  to run to rebuild the index (`open_index` gives the exact `tandem index build` command).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from tandem.errors import TandemError
from tandem.retrieval.chunking import Chunk

SCHEMA = """
CREATE TABLE chunks (
    row INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    start INTEGER NOT NULL,
    end INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL,
    text TEXT NOT NULL,
    source TEXT NOT NULL,
    meta TEXT NOT NULL,
    lead TEXT
);
CREATE INDEX chunks_doc ON chunks (doc_id, position);
"""
COLUMNS = "key, doc_id, position, start, end, n_tokens, text, source, meta, lead"
# A docstore written before chunks carried `lead` has no such column: read as NULL (unknown).
COLUMNS_WITHOUT_LEAD = COLUMNS.replace(", lead", ", NULL")


def write_docstore(path: Path, chunks: Iterable[Chunk]) -> int:
    """Create a new docstore file holding `chunks` as rows 0..n-1; returns n."""
    connection = sqlite3.connect(path)
    try:
        connection.executescript(SCHEMA)
        rows = (
            (
                i,
                c.key,
                c.doc_id,
                c.position,
                c.start,
                c.end,
                c.n_tokens,
                c.text,
                c.source,
                json.dumps(dict(c.meta), sort_keys=True),
                c.lead,
            )
            for i, c in enumerate(chunks)
        )
        connection.executemany(
            f"INSERT INTO chunks (row, {COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows
        )
        connection.commit()
        (count,) = connection.execute("SELECT COUNT(*) FROM chunks").fetchone()
    finally:
        connection.close()
    return int(count)


def _chunk(record: tuple) -> Chunk:
    key, doc_id, position, start, end, n_tokens, text, source, meta, lead = record
    return Chunk(
        key=key,
        doc_id=doc_id,
        position=position,
        start=start,
        end=end,
        n_tokens=n_tokens,
        text=text,
        source=source,
        meta=json.loads(meta),
        lead=lead,
    )


REBUILD_HINT = "rebuild it with tandem index build"


def unreadable(path: Path, reason: str | None, hint: str = REBUILD_HINT) -> TandemError:
    """The one-line error for an index file that cannot be read (reason None: missing)."""
    path = Path(path)
    state = "is missing" if reason is None else f"is unreadable ({reason})"
    return TandemError(f"{path.parent}: {path.name} {state}; {hint}")


class DocStore:
    """Read access to a docstore file (read-only connection); checked when opened."""

    def __init__(self, path: Path, *, hint: str = REBUILD_HINT):
        if not Path(path).is_file():
            raise unreadable(path, None, hint)
        self.path, self.hint = Path(path), hint
        self.connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        try:
            len(self)  # SQLite reads the file lazily: fail here, not at the first search
            names = {r[1] for r in self._rows("PRAGMA table_info(chunks)")}
        except TandemError:
            self.connection.close()
            raise
        self.columns = COLUMNS if "lead" in names else COLUMNS_WITHOUT_LEAD

    @property
    def has_leads(self) -> bool:
        """Whether the chunks' leads are stored (docstores written since 2026-11-29)."""
        return self.columns == COLUMNS

    def _rows(self, sql: str, params: Sequence = ()) -> list[tuple]:
        try:
            return self.connection.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:  # also OperationalError (e.g. no such table)
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise unreadable(self.path, reason, self.hint) from exc

    def __len__(self) -> int:
        ((count,),) = self._rows("SELECT COUNT(*) FROM chunks")
        return int(count)

    def get(self, rows: list[int]) -> list[Chunk]:
        """Chunks at the given rows, in the given order."""
        if not rows:
            return []
        marks = ",".join("?" * len(rows))
        found = {
            r[0]: _chunk(r[1:])
            for r in self._rows(
                f"SELECT row, {self.columns} FROM chunks WHERE row IN ({marks})",
                [int(r) for r in rows],
            )
        }
        missing = [r for r in rows if r not in found]
        if missing:
            raise unreadable(self.path, f"it lacks rows {missing[:5]}", self.hint)
        return [found[r] for r in rows]

    def all(self) -> list[Chunk]:
        """Every chunk, by row."""
        return [_chunk(r) for r in self._rows(f"SELECT {self.columns} FROM chunks ORDER BY row")]

    def document(self, doc_id: str) -> list[Chunk]:
        """The chunks of one document, in position order."""
        return [
            _chunk(r)
            for r in self._rows(
                f"SELECT {self.columns} FROM chunks WHERE doc_id = ? ORDER BY position", (doc_id,)
            )
        ]

    def between(self, doc_id: str, after: int, before: int) -> list[Chunk]:
        """The chunks of one document at positions after < p < before, in position order."""
        return [
            _chunk(r)
            for r in self._rows(
                f"SELECT {self.columns} FROM chunks WHERE doc_id = ? AND position > ? AND position < ?"
                " ORDER BY position",
                (doc_id, int(after), int(before)),
            )
        ]

    def close(self) -> None:
        self.connection.close()
