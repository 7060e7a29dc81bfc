"""DRAGON's index cache (`ensure_index`, under `$TANDEM_HOME/indexes/`): built once, rebuilt
when damaged (other cached indexes left alone), unreadable corpus files skipped with a warning
naming them, an empty corpus a one-line error."""

from __future__ import annotations

import pytest

from tandem.errors import TandemError
from tandem.models.tiny import ByteTokenizer
from tandem.protocols.dragon import setup as dragon_setup
from tandem.protocols.dragon.setup import ensure_index
from tandem.retrieval.index import DOCSTORE_FILE, FAISS_FILE, MANIFEST, check_index


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dragon_setup, "EMBEDDER", "hashing-128")  # no MiniLM in a unit test
    return tmp_path / "home"


def folder(root, files: dict[str, bytes]):
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def index(corpus) -> object:
    return ensure_index(str(corpus), tokenizer=ByteTokenizer(), tokenizer_name="tiny-qwen2",
                        progress=False)  # fmt: skip


def files(path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in path.iterdir()}


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        (FAISS_FILE, lambda f: f.write_bytes(f.read_bytes()[:40])),
        (DOCSTORE_FILE, lambda f: f.write_bytes(b"not a database" * 30)),
        (DOCSTORE_FILE, lambda f: f.unlink()),
        (MANIFEST, lambda f: f.unlink()),
    ],
    ids=["faiss-cut", "docstore-garbage", "docstore-gone", "manifest-gone"],
)
def test_a_damaged_cached_index_is_rebuilt_and_others_are_left_alone(
    home, tmp_path, capsys, name, damage
):
    notes = folder(tmp_path / "notes", {"a.md": b"retry with backoff", "b.md": b"flatline check"})
    other = folder(tmp_path / "other", {"c.md": b"the moon tide table"})
    path, other_path = index(notes), index(other)
    assert path.parent == home / "indexes" and check_index(path).documents == 2
    kept, before = files(other_path), files(path)
    assert index(notes) == path and files(path) == before  # whole: used as it is
    capsys.readouterr()
    damage(path / name)
    assert index(notes) == path
    err = capsys.readouterr().err
    assert err.startswith("the cached index is damaged (") and err.endswith("; rebuilding it\n")
    assert err.count("\n") == 1 and "rebuild it:" not in err
    assert check_index(path).documents == 2
    assert files(other_path) == kept


def test_unreadable_corpus_files_are_skipped_with_a_warning(home, tmp_path, capsys):
    notes = folder(
        tmp_path / "notes", {"a.md": b"retry", "blob.bin": b"\x00\x01", "l.txt": b"\xe9"}
    )
    check_index(index(notes))
    err = capsys.readouterr().err
    assert f"skipped {notes / 'blob.bin'}: binary file\n" in err
    assert f"skipped {notes / 'l.txt'}: not UTF-8 text\n" in err


def test_an_empty_corpus_is_a_one_line_error(home, tmp_path):
    empty = folder(tmp_path / "empty", {})
    with pytest.raises(TandemError, match=r"no text documents found in .*empty: nothing to index"):
        index(empty)
    only_binary = folder(tmp_path / "binary", {"x.bin": b"\x00"})
    with pytest.raises(TandemError, match=r"\(1 skipped: unreadable, binary or not UTF-8\)"):
        index(only_binary)
