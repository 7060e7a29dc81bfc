import pytest

from tandem.retrieval.stdlib import (
    eval_windows,
    in_test_part,
    module_files,
    split_by_package,
    stdlib_documents,
)


@pytest.fixture(scope="module")
def docs():
    return stdlib_documents()  # a few seconds: extracted once for this module


def test_stdlib_corpus_is_public_docstrings_in_fixed_order(docs):
    assert len(docs) > 1000
    ids = [d.doc_id for d in docs]
    assert len(ids) == len(set(ids))
    assert ids == [d.doc_id for d in stdlib_documents()]  # deterministic
    by_id = {d.doc_id: d for d in docs}
    dumps = by_id["stdlib:json.dumps"]
    assert dumps.text.startswith("json.dumps(obj, *, skipkeys=False")
    assert "Serialize ``obj``" in dumps.text and dumps.meta["kind"] == "function"
    modules = {m for m, _ in module_files()}
    assert "json" in modules and "email.mime.text" in modules
    assert not any(
        m.startswith(("test.", "idlelib")) or "._" in m or m.startswith("_") for m in modules
    )


def test_split_keeps_whole_packages_apart(docs):
    retrieval, test = split_by_package(docs, test_fraction=0.1)
    assert len(retrieval) + len(test) == len(docs)
    train_packages = {d.meta["package"] for d in retrieval}
    test_packages = {d.meta["package"] for d in test}
    assert train_packages.isdisjoint(test_packages) and test_packages
    assert 0.02 < len(test_packages) / len(train_packages | test_packages) < 0.25
    assert in_test_part("email", 0.1) == in_test_part("email", 0.1)


def test_eval_windows_have_the_asked_length(docs, byte_tokenizer):
    _, test = split_by_package(docs, test_fraction=0.1)
    windows = eval_windows(test, byte_tokenizer, window_tokens=256, max_windows=20)
    assert len(windows) == 20
    assert all(len(w.ids) == 256 and len(w.query_ids) == 32 for w in windows)
    assert all(len(w.scored_ids) == 224 for w in windows)
