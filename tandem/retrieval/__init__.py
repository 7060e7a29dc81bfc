"""tandem.retrieval: what each side retrieves from, and how.

Modules, bottom up:
- `document`: `Document`, the unit of text every corpus holds;
- `corpus`: documents from folders, JSONL files, or `stdlib` (skips binary/unreadable files);
- `stdlib`: the public corpus (stdlib docstrings via `ast`) and its held-out evaluation split;
- `chunking`: token-bounded chunks cut with the generating model's tokenizer;
- `embedder`: the `Embedder` protocol, offline all-MiniLM-L6-v2, and a hashing fake;
- `docstore`, `index`: index folders (faiss + SQLite + manifest), built atomically and
  incrementally; `search`: `Retriever.search(query, k) -> [(chunk, score)]`;
- `scorer`: relevance scores that follow the growing context (DRAGON's dynamic weights);
- `kvstore`: each document's KV cache on disk, keyed by model fingerprint.
"""
