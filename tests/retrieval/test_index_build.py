from pathlib import Path

import numpy as np
import pytest
from retrieval_fakes import WordTokenizer

from tandem.errors import TandemError
from tandem.models.tiny import ByteTokenizer
from tandem.retrieval.chunking import ChunkParams
from tandem.retrieval.embedder import HashingEmbedder
from tandem.retrieval.index import (
    DOCSTORE_FILE,
    FAISS_FILE,
    MANIFEST,
    add_to_index,
    build_index,
    open_index,
    read_manifest,
)
from tandem.retrieval.search import index_vectors

PARAMS = ChunkParams(chunk_tokens=64, overlap=8)


def build(sources, out, embedder, tokenizer=None, **kw):
    return build_index(
        sources,
        out,
        tokenizer=tokenizer or ByteTokenizer(),
        tokenizer_name="tiny-qwen2",
        embedder=embedder,
        params=kw.pop("params", PARAMS),
        on_skip=lambda p, r: None,
        **kw,
    )


def corpus(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_build_writes_index_docstore_manifest_and_searches(tmp_path, notes, embedder):
    report = build([notes], tmp_path / "ix", embedder)
    files = sorted(p.name for p in (tmp_path / "ix").iterdir())
    assert files == sorted([MANIFEST, FAISS_FILE, DOCSTORE_FILE])
    manifest = read_manifest(tmp_path / "ix")
    assert manifest.embedder == "hashing-128" and manifest.dim == 128
    assert manifest.tokenizer_fingerprint == ByteTokenizer.fingerprint
    assert (manifest.chunk_tokens, manifest.overlap) == (64, 8)
    assert manifest.documents == 17 and manifest.chunks == report.embedded > 17
    assert report.reused == 0 and report.bytes > 0
    retriever = open_index(tmp_path / "ix", embedder=embedder)
    hits = retriever.search("exponential backoff full jitter retry attempts", k=5)
    assert len(hits) == 5 and [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert hits[0][0].doc_id.startswith("private-notes/")
    assert "backoff" in hits[0][0].text.lower() or "retr" in hits[0][0].text.lower()
    chunk = hits[0][0]
    source_text = (notes / chunk.doc_id.split("/", 1)[1]).read_text()
    assert source_text[chunk.start : chunk.end] == chunk.text
    assert leftovers(tmp_path) == []
    # the docstore gives a document's chunks between two positions, as the index holds them
    document = retriever.lookup.document("private-notes/snippets/backoff.py")
    assert len(document) >= 3
    inside = retriever.between("private-notes/snippets/backoff.py", 0, len(document) - 1)
    assert inside == document[1:-1]
    assert retriever.between("private-notes/snippets/backoff.py", 0, 1) == []
    assert retriever.between("no/such/document", 0, 9) == []


def test_rebuild_reuses_vectors_and_only_embeds_changed_chunks(tmp_path):
    src = corpus(
        tmp_path / "src", {f"n{i}.md": f"note {i} " + "lorem ipsum " * 40 for i in range(5)}
    )
    embedder = HashingEmbedder(64)
    first = build([src], tmp_path / "ix", embedder)
    vectors_before = index_vectors(open_index(tmp_path / "ix", embedder=embedder).index)
    calls = embedder.texts_embedded
    assert calls == first.embedded > 0

    again = build([src], tmp_path / "ix", embedder)
    assert (again.embedded, again.reused) == (0, first.manifest.chunks)
    assert embedder.texts_embedded == calls  # not one text embedded again
    np.testing.assert_array_equal(
        index_vectors(open_index(tmp_path / "ix", embedder=embedder).index), vectors_before
    )

    (src / "n2.md").write_text("note 2, changed and now short")
    (src / "new.md").write_text("a brand new note about tides")
    third = build([src], tmp_path / "ix", embedder)
    assert third.embedded == embedder.texts_embedded - calls == 2  # one chunk each
    assert third.reused == third.manifest.chunks - 2
    assert leftovers(tmp_path) == []


def test_add_keeps_old_documents_and_embeds_only_new_ones(tmp_path):
    a = corpus(tmp_path / "a", {"x.md": "alpha " * 30, "y.md": "beta " * 30})
    b = corpus(tmp_path / "b", {"z.md": " ".join(f"gamma{i}" for i in range(30))})
    embedder = HashingEmbedder(64)
    first = build([a], tmp_path / "ix", embedder)
    before = embedder.texts_embedded
    report = add_to_index(
        tmp_path / "ix",
        [b],
        tokenizer=ByteTokenizer(),
        embedder=embedder,
        on_skip=lambda p, r: None,
    )
    retriever = open_index(tmp_path / "ix", embedder=embedder)
    new_chunks = len(retriever.lookup.document("b/z.md"))
    assert embedder.texts_embedded - before == report.embedded == new_chunks == 4  # 209 bytes
    assert report.reused == first.manifest.chunks
    manifest = read_manifest(tmp_path / "ix")
    assert manifest.documents == 3 and manifest.sources == (str(a), str(b))
    assert retriever.search("gamma7 gamma8", 1)[0][0].doc_id == "b/z.md"
    assert retriever.search("alpha alpha", 1)[0][0].doc_id == "a/x.md"

    (b / "z.md").write_text("delta " * 10)  # same doc id: replaced, not duplicated
    add_to_index(
        tmp_path / "ix",
        [b],
        tokenizer=ByteTokenizer(),
        embedder=embedder,
        on_skip=lambda p, r: None,
    )
    retriever = open_index(tmp_path / "ix", embedder=embedder)
    assert read_manifest(tmp_path / "ix").documents == 3
    assert [c.text for c in retriever.lookup.document("b/z.md")] == [("delta " * 10).strip()]


def test_another_embedder_or_tokenizer_is_refused(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    with pytest.raises(TandemError, match="built with embedder 'hashing-128', not 'hashing-64'"):
        open_index(tmp_path / "ix", embedder=HashingEmbedder(64))
    with pytest.raises(TandemError, match="built with tokenizer"):
        open_index(tmp_path / "ix", embedder=embedder, tokenizer=WordTokenizer())
    with pytest.raises(TandemError, match="built with tokenizer"):
        add_to_index(tmp_path / "ix", [notes], tokenizer=WordTokenizer(), embedder=embedder)
    with pytest.raises(TandemError, match="built with embedder"):
        add_to_index(
            tmp_path / "ix", [notes], tokenizer=ByteTokenizer(), embedder=HashingEmbedder(32)
        )


def test_empty_folder_is_an_error_and_writes_nothing(tmp_path, embedder):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blob.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(TandemError, match="no text documents found"):
        build([tmp_path / "empty"], tmp_path / "ix", embedder)
    assert not (tmp_path / "ix").exists() and leftovers(tmp_path) == []


def test_skips_are_reported(tmp_path, embedder):
    src = corpus(tmp_path / "src", {"a.md": "alpha"})
    (src / "b.bin").write_bytes(b"\x00\x01")
    report = build([src], tmp_path / "ix", embedder)
    assert [(Path(p).name, r) for p, r in report.skipped] == [("b.bin", "binary file")]


class FailingEmbedder(HashingEmbedder):
    def embed(self, texts):
        raise RuntimeError("embedder crashed")


def test_failure_leaves_the_old_index_untouched_and_no_temp_files(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    before = {p.name: p.read_bytes() for p in (tmp_path / "ix").iterdir()}
    src = corpus(tmp_path / "src", {"a.md": "something new"})
    with pytest.raises(RuntimeError, match="embedder crashed"):
        build([src], tmp_path / "ix", FailingEmbedder(128))
    with pytest.raises(RuntimeError, match="embedder crashed"):
        add_to_index(
            tmp_path / "ix", [src], tokenizer=ByteTokenizer(), embedder=FailingEmbedder(128)
        )
    assert {p.name: p.read_bytes() for p in (tmp_path / "ix").iterdir()} == before
    assert leftovers(tmp_path) == []


def test_failure_while_writing_removes_the_temporary_folder(tmp_path, notes, embedder, monkeypatch):
    import tandem.retrieval.index as index_module

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(index_module, "write_docstore", broken)
    with pytest.raises(OSError, match="disk full"):
        build([notes], tmp_path / "ix", embedder)
    assert list(tmp_path.iterdir()) == []


def test_out_folder_that_is_not_an_index_is_refused(tmp_path, notes, embedder):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "precious.txt").write_text("do not delete")
    with pytest.raises(TandemError, match="not a tandem index"):
        build([notes], tmp_path / "mine", embedder)
    assert (tmp_path / "mine" / "precious.txt").read_text() == "do not delete"
    with pytest.raises(TandemError, match="not a tandem index"):
        open_index(tmp_path / "mine")


def test_corrupt_index_is_detected(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    (tmp_path / "ix" / DOCSTORE_FILE).unlink()
    with pytest.raises(TandemError, match=r"docstore\.sqlite is missing; rebuild it: tandem index"):
        open_index(tmp_path / "ix", embedder=embedder)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[: len(data) // 2], r"truncated: read \d+ of \d+ bytes"),
        (lambda data: b"", "truncated"),
        (lambda data: b"garbage!" * 64, r"Index type .* not recognized\)"),
    ],
    ids=["half", "empty", "garbage"],
)
def test_unreadable_faiss_file_is_a_one_line_error(tmp_path, notes, embedder, damage, reason):
    build([notes], tmp_path / "ix", embedder)
    faiss_file = tmp_path / "ix" / FAISS_FILE
    faiss_file.write_bytes(damage(faiss_file.read_bytes()))
    for attempt in (
        lambda: open_index(tmp_path / "ix", embedder=embedder),
        lambda: add_to_index(
            tmp_path / "ix", [notes], tokenizer=ByteTokenizer(), embedder=embedder
        ),
    ):
        with pytest.raises(TandemError, match=rf"index\.faiss is unreadable \({reason}") as caught:
            attempt()
        message = str(caught.value)
        assert str(tmp_path / "ix") in message and "tandem index build" in message
        assert "\n" not in message and "Error in" not in message and ".cpp" not in message


@pytest.mark.parametrize(
    "damage",
    [lambda data: b"not a database " * 40, lambda data: data[: len(data) // 2], lambda data: b""],
    ids=["garbage", "half", "empty"],
)
def test_unreadable_docstore_is_a_one_line_error(tmp_path, notes, embedder, damage):
    build([notes], tmp_path / "ix", embedder)
    docstore = tmp_path / "ix" / DOCSTORE_FILE
    docstore.write_bytes(damage(docstore.read_bytes()))
    with pytest.raises(TandemError, match=r"docstore\.sqlite is unreadable \(") as caught:
        open_index(tmp_path / "ix", embedder=embedder)
    assert str(tmp_path / "ix") in str(caught.value) and "\n" not in str(caught.value)


def test_build_over_an_unreadable_index_of_the_same_embedder_rebuilds_it(tmp_path, notes, embedder):
    first = build([notes], tmp_path / "ix", embedder)
    (tmp_path / "ix" / FAISS_FILE).write_bytes(b"")
    again = build([notes], tmp_path / "ix", embedder)
    assert (again.embedded, again.reused) == (first.embedded, 0)  # nothing readable to reuse
    assert len(open_index(tmp_path / "ix", embedder=embedder)) == first.manifest.chunks
    assert leftovers(tmp_path) == []


def test_build_over_an_index_of_another_embedder_or_tokenizer_is_refused(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    before = snapshot(tmp_path / "ix")
    other = HashingEmbedder(64)
    with pytest.raises(TandemError) as caught:
        build([notes], tmp_path / "ix", other)
    message = str(caught.value)
    assert "embedder 'hashing-128'" in message and "embedder 'hashing-64'" in message
    assert "--replace" in message and str(tmp_path / "ix") in message and "\n" not in message
    assert other.texts_embedded == 0  # refused before any work
    with pytest.raises(TandemError) as caught:
        build([notes], tmp_path / "ix", embedder, tokenizer=WordTokenizer())
    message = str(caught.value)
    assert ByteTokenizer.fingerprint[:12] in message and WordTokenizer.fingerprint[:12] in message
    assert snapshot(tmp_path / "ix") == before
    assert leftovers(tmp_path) == []


def test_replace_overwrites_an_index_of_another_embedder(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    other = HashingEmbedder(64)
    report = build([notes], tmp_path / "ix", other, replace=True)
    assert read_manifest(tmp_path / "ix").embedder == "hashing-64"
    assert (report.embedded, report.reused) == (report.manifest.chunks, 0)
    assert len(open_index(tmp_path / "ix", embedder=other).search("retry backoff", 3)) == 3
    report = build([notes], tmp_path / "ix", embedder, tokenizer=WordTokenizer(), replace=True)
    assert read_manifest(tmp_path / "ix").tokenizer_fingerprint == WordTokenizer.fingerprint
    again = build([notes], tmp_path / "ix", embedder, tokenizer=WordTokenizer(), replace=True)
    assert (again.embedded, again.reused) == (0, report.manifest.chunks)  # still reuses
    assert leftovers(tmp_path) == []


def test_replace_overwrites_an_index_with_an_unreadable_manifest(tmp_path, notes, embedder):
    build([notes], tmp_path / "ix", embedder)
    (tmp_path / "ix" / MANIFEST).write_text("{not json")
    with pytest.raises(TandemError, match="unreadable manifest.json.*--replace"):
        build([notes], tmp_path / "ix", embedder)
    build([notes], tmp_path / "ix", embedder, replace=True)
    assert read_manifest(tmp_path / "ix").embedder == "hashing-128"


def test_hnsw_index_finds_what_flat_finds(tmp_path, notes, embedder):
    build([notes], tmp_path / "flat", embedder)
    build([notes], tmp_path / "hnsw", embedder, kind="hnsw")
    flat = open_index(tmp_path / "flat", embedder=embedder)
    hnsw = open_index(tmp_path / "hnsw", embedder=embedder)
    assert read_manifest(tmp_path / "hnsw").index_kind == "hnsw"
    for query in [
        "sqlite wal mode backup",
        "flatline suspect threshold",
        "deploy the wheel on the pi",
    ]:
        assert [c.key for c, _ in flat.search(query, 3)] == [
            c.key for c, _ in hnsw.search(query, 3)
        ]
    with pytest.raises(TandemError, match="unknown index kind"):
        build([notes], tmp_path / "x", embedder, kind="ivf")


@pytest.mark.parametrize("name", [FAISS_FILE, DOCSTORE_FILE])
def test_missing_file_names_it_and_gives_the_exact_rebuild_command(tmp_path, notes, embedder, name):
    from tandem.retrieval.index import check_index

    build([notes], tmp_path / "ix", embedder)
    (tmp_path / "ix" / name).unlink()
    command = (
        f"tandem index build {notes} --out {tmp_path / 'ix'} --tokenizer tiny-qwen2 "
        "--embedder hashing-128 --chunk-tokens 64 --overlap 8"
    )
    for attempt in (
        lambda: open_index(tmp_path / "ix", embedder=embedder),
        lambda: check_index(tmp_path / "ix"),
    ):
        with pytest.raises(TandemError) as caught:
            attempt()
        assert str(caught.value) == f"{tmp_path / 'ix'}: {name} is missing; rebuild it: {command}"


def test_check_index_reads_the_files_without_an_embedder(tmp_path, notes, embedder):
    from tandem.retrieval.index import check_index

    report = build([notes], tmp_path / "ix", embedder)
    assert check_index(tmp_path / "ix") == report.manifest
    docstore = tmp_path / "ix" / DOCSTORE_FILE
    docstore.write_bytes(docstore.read_bytes()[:100])
    with pytest.raises(TandemError, match=r"docstore\.sqlite is unreadable \(.*rebuild it: tandem"):
        check_index(tmp_path / "ix")


@pytest.mark.parametrize(
    "blob", [b"\xff\xfe\x00garbage", b"[1, 2]", b'{"format": "tandem-index-1"}']
)
def test_unreadable_manifest_is_one_line(tmp_path, notes, embedder, blob):
    build([notes], tmp_path / "ix", embedder)
    (tmp_path / "ix" / MANIFEST).write_bytes(blob)
    with pytest.raises(TandemError, match="unreadable manifest.json .*--replace") as caught:
        open_index(tmp_path / "ix", embedder=embedder)
    assert "\n" not in str(caught.value)


def test_a_corpus_of_only_unreadable_files_is_an_error_that_says_so(tmp_path, embedder):
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(b"\x00\x01\x02")
    (src / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(TandemError, match=r"\(2 skipped: unreadable, binary or not UTF-8\)"):
        build([src], tmp_path / "ix", embedder)


def test_the_docstore_keeps_each_chunks_lead_and_reads_an_older_one_without(
    tmp_path, notes, caplog
):
    import sqlite3

    from tandem.retrieval.docstore import DocStore

    params = ChunkParams(chunk_tokens=64, overlap=0)
    build([notes], tmp_path / "ix", HashingEmbedder(32), params=params)
    retriever = open_index(tmp_path / "ix", embedder=HashingEmbedder(32))
    chunks = retriever.lookup.document("private-notes/snippets/backoff.py")
    text = (notes / "snippets" / "backoff.py").read_text()
    assert len(chunks) > 2 and "".join(c.lead + c.text for c in chunks) == text.rstrip()
    retriever.lookup.close()
    with sqlite3.connect(tmp_path / "ix" / DOCSTORE_FILE) as db:  # as written before leads
        db.execute("ALTER TABLE chunks DROP COLUMN lead")
    older = DocStore(tmp_path / "ix" / DOCSTORE_FILE)
    assert retriever.lookup.has_leads and not older.has_leads
    assert [c.text for c in older.document(chunks[0].doc_id)] == [c.text for c in chunks]
    assert {c.lead for c in older.get(list(range(len(older))))} == {None}
    older.close()
    with caplog.at_level("WARNING", logger="tandem.retrieval"):  # named once, with the fix
        for _ in range(2):
            open_index(tmp_path / "ix", embedder=HashingEmbedder(32)).lookup.close()
    warned = [r.getMessage() for r in caplog.records if "whitespace" in r.getMessage()]
    assert len(warned) == 1 and "tandem index build" in warned[0] and str(notes) in warned[0]
