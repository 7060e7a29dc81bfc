from pathlib import Path

import pytest

from tandem.errors import TandemError
from tandem.retrieval.corpus import read_folder, read_jsonl, read_source, read_sources


def make_folder(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "a.md").write_text("# A\nalpha beta\n")
    (root / "sub" / "b.py").write_text("def b():\n    return 2\n")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "empty.txt").write_text("   \n")
    (root / ".hidden.md").write_text("secret")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.txt").write_text("cache")
    return root


def test_folder_reads_text_and_skips_binary(tmp_path):
    skipped = []
    docs = list(
        read_folder(make_folder(tmp_path / "notes"), lambda p, r: skipped.append((Path(p).name, r)))
    )
    assert [d.doc_id for d in docs] == ["notes/a.md", "notes/sub/b.py"]
    assert docs[1].meta["suffix"] == ".py"
    assert sorted(skipped) == [("blob.bin", "binary file"), ("latin1.txt", "not UTF-8 text")]


def test_unreadable_file_is_skipped(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "notes")
    real = Path.read_bytes

    def read_bytes(self):
        if self.name == "a.md":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    skipped = []
    docs = list(read_folder(root, lambda p, r: skipped.append((Path(p).name, r))))
    assert [d.doc_id for d in docs] == ["notes/sub/b.py"]
    assert ("a.md", "unreadable (Permission denied)") in skipped


def test_fifo_is_skipped_not_blocking(tmp_path):
    import os

    root = tmp_path / "n"
    root.mkdir()
    os.mkfifo(root / "pipe")
    (root / "x.md").write_text("x")
    skipped = []
    assert [d.doc_id for d in read_folder(root, lambda p, r: skipped.append(r))] == ["n/x.md"]
    assert skipped == ["not a regular file"]


def test_jsonl_records_and_bad_lines(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(
        '{"id": "d1", "text": "hello", "meta": {"lang": "en"}}\n'
        "not json\n"
        '{"id": "d2"}\n'
        '{"id": "d1", "text": "again"}\n'
        '{"text": "no id"}\n'
    )
    skipped = []
    docs = list(read_jsonl(path, lambda p, r: skipped.append(r)))
    assert [(d.doc_id, d.text, dict(d.meta)) for d in docs] == [
        ("d1", "hello", {"lang": "en"}),
        ("docs.jsonl:5", "no id", {}),
    ]
    assert len(skipped) == 3


def test_bad_sources_are_one_line_errors(tmp_path):
    with pytest.raises(TandemError, match="does not exist"):
        list(read_source(tmp_path / "missing"))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(TandemError, match="neither a folder"):
        list(read_source(tmp_path / "x.csv"))


def test_sources_deduplicate_ids(tmp_path, notes):
    docs = read_sources([notes, notes], on_skip=lambda p, r: None)
    assert len(docs) == len({d.doc_id for d in docs}) == len(list(read_folder(notes)))
    assert 10 <= len(docs) <= 20
