import pytest
import torch

from tandem.errors import TandemError
from tandem.models.registry import load_model
from tandem.retrieval.kvstore import DocKVStore, ids_key


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-qwen2")


DOC = "def retry_async(call, *, attempts=5):\n    # exponential backoff with full jitter\n"


def test_loaded_state_equals_fresh_prefill_and_decodes_the_same(tmp_path, lm):
    store = DocKVStore(tmp_path, lm)
    ids = lm.tokenizer.encode(DOC)
    assert ids not in store
    path = store.put(ids)
    assert ids in store and path.parent.name == lm.fingerprint[:24]
    loaded = store.load(ids)
    fresh = lm.prefill(ids)
    assert loaded.row_ids(0) == ids
    assert torch.allclose(loaded.logits, fresh.logits, atol=1e-5, rtol=0)
    query = lm.tokenizer.encode("Q: how many attempts?\nA:")
    from_loaded = lm.decode(loaded, [query])  # [1, n, vocab]
    from_fresh = lm.decode(fresh, [query])
    assert torch.allclose(from_loaded, from_fresh, atol=1e-5, rtol=0)
    for _ in range(5):  # greedy continuation token by token
        next_ids = [[int(from_fresh[0, -1].argmax())]]
        assert int(from_loaded[0, -1].argmax()) == next_ids[0][0]
        from_loaded, from_fresh = lm.decode(loaded, next_ids), lm.decode(fresh, next_ids)
        assert torch.allclose(from_loaded, from_fresh, atol=1e-5, rtol=0)


def test_get_or_prefill_and_precompute(tmp_path, lm):
    store = DocKVStore(tmp_path, lm)
    docs = [lm.tokenizer.encode(t) for t in ["alpha", "beta gamma", "alpha"]]
    assert store.precompute(docs) == 2
    assert store.precompute(docs) == 0
    state, hit = store.get_or_prefill(docs[1])
    assert hit and state.row_ids(0) == docs[1]
    state, hit = store.get_or_prefill(lm.tokenizer.encode("delta"))
    assert not hit and lm.tokenizer.encode("delta") in store
    assert store.nbytes(docs[0]) > 0
    assert ids_key([1, 2]) != ids_key([2, 1])


def test_other_model_or_missing_entry_is_refused(tmp_path, lm):
    store = DocKVStore(tmp_path, lm)
    ids = lm.tokenizer.encode(DOC)
    store.put(ids)
    other = load_model("tiny-qwen2-b")
    with pytest.raises(TandemError, match="another model"):
        other.load_state(store.path(ids))
    other_store = DocKVStore(tmp_path, other)
    assert ids not in other_store  # its own folder
    with pytest.raises(TandemError, match="no entry"):
        other_store.load(ids)
    with pytest.raises(TandemError, match="empty"):
        store.put([])


@pytest.mark.parametrize(
    "damage",
    [lambda data: data[: len(data) // 2], lambda data: b"", lambda data: b"garbage" * 50],
    ids=["half", "empty", "garbage"],
)
def test_a_damaged_entry_is_a_one_line_error_and_get_or_prefill_rebuilds_it(
    tmp_path, lm, caplog, damage
):
    store = DocKVStore(tmp_path, lm)
    ids, other = lm.tokenizer.encode(DOC), lm.tokenizer.encode("another document")
    store.precompute([ids, other])
    kept = store.path(other).read_bytes()
    path = store.path(ids)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(TandemError) as caught:
        store.load(ids)
    message = str(caught.value)
    assert message.startswith(f"{path}: unreadable KV file") and "\n" not in message
    with caplog.at_level("WARNING", logger="tandem.retrieval"):
        state, hit = store.get_or_prefill(ids)
    assert not hit and state.row_ids(0) == ids
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"{path}: unreadable KV file") and "prefilled it again" in warning
    assert torch.allclose(store.load(ids).logits, lm.prefill(ids).logits, atol=1e-5, rtol=0)
    assert store.path(other).read_bytes() == kept  # the good entry is left alone
