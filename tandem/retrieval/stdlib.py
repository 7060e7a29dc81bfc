"""The public corpus every machine has: docstrings of the local Python standard library.

Words used here:
- *entry*: one documented object (module, class, function or method) with its docstring,
  extracted with `ast` (nothing is imported). Its document text is a heading line
  (`json.dumps(obj, *, skipkeys=False, ...)`) followed by the docstring.
- *package*: the top-level name of a module (`email` for `email.mime.text`). The evaluation
  split assigns whole packages to either the retrieval part or the test part, by a hash of the
  name, so no package's text leaks from one part into the other.
- *eval window*: a held-out run of `window_tokens` tokens of test-part text, for perplexity
  (like DRAGON's rolling windows over WikiText's test set): its first `query_tokens` tokens
  are the retrieval query, the rest is scored.

Private modules and objects (leading underscore), tests, idlelib, tkinter, turtledemo,
ensurepip, lib2to3 and site-packages are left out. Order is sorted, hence deterministic.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tandem.models.base import Tokenizer
from tandem.retrieval.document import Document

EXCLUDED_TOP = frozenset(
    {
        "test",
        "tests",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "pydoc_data",
        "venv",
    }
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(dotted module name, path) of every public stdlib module, sorted by name."""
    root = root or stdlib_root()
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel.parts and (rel.parts[0] in EXCLUDED_TOP or rel.parts[0].startswith("config-")):
            dirnames[:] = []
            continue
        dirnames[:] = [
            d for d in dirnames if d not in EXCLUDED_TOP and not d.startswith((".", "_"))
        ]
        for name in filenames:
            if not name.endswith(".py") or (name.startswith("_") and name != "__init__.py"):
                continue
            parts = [*rel.parts, name[:-3]]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and not any(p.startswith("_") for p in parts):
                found.append((".".join(parts), Path(dirpath) / name))
    return sorted(found)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(node.args)
    return f"({args})"


def _entries(tree: ast.Module, module: str) -> Iterator[tuple[str, str, str, str]]:
    """(qualified name, kind, heading, docstring) for the module and its public defs."""
    doc = ast.get_docstring(tree)
    if doc:
        yield module, "module", f"module {module}", doc

    def walk(
        body: list[ast.stmt], prefix: str, in_class: bool
    ) -> Iterator[tuple[str, str, str, str]]:
        for node in body:
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_") and node.name != "__init__":
                continue
            qual = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if isinstance(node, ast.ClassDef):
                if doc:
                    yield qual, "class", f"class {qual}", doc
                yield from walk(node.body, qual, True)
            elif doc:
                kind = "method" if in_class else "function"
                yield qual, kind, f"{qual}{_signature(node)}", doc

    yield from walk(tree.body, module, False)


def stdlib_documents(root: Path | None = None) -> list[Document]:
    """One document per documented public module, class, function and method."""
    docs: dict[str, Document] = {}
    for module, path in module_files(root):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue  # a file this interpreter cannot parse (none in a normal installation)
        for qual, kind, heading, doc in _entries(tree, module):
            # a property's getter and setter share a name: the first (the getter) is kept
            docs.setdefault(
                f"stdlib:{qual}",
                Document(
                    doc_id=f"stdlib:{qual}",
                    text=f"{heading}\n\n{doc}",
                    source="stdlib",
                    meta={"module": module, "package": module.split(".")[0], "kind": kind},
                ),
            )
    return list(docs.values())


def in_test_part(package: str, test_fraction: float, salt: str = "tandem-eval-v1") -> bool:
    """Deterministic assignment of a package to the test part (hash of its name)."""
    digest = hashlib.sha256(f"{salt}:{package}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction


def split_by_package(
    docs: list[Document], *, test_fraction: float = 0.1
) -> tuple[list[Document], list[Document]]:
    """(retrieval part, test part) of stdlib documents, whole packages on one side."""
    retrieval, test = [], []
    for doc in docs:
        package = str(doc.meta.get("package", doc.doc_id))
        (test if in_test_part(package, test_fraction) else retrieval).append(doc)
    return retrieval, test


@dataclass(frozen=True, kw_only=True)
class EvalWindow:
    package: str
    ids: tuple[int, ...]  # window_tokens token ids of held-out text
    query_tokens: int  # the first query_tokens ids are the retrieval query

    @property
    def query_ids(self) -> tuple[int, ...]:
        return self.ids[: self.query_tokens]

    @property
    def scored_ids(self) -> tuple[int, ...]:
        return self.ids[self.query_tokens :]


def eval_windows(
    test_docs: list[Document],
    tokenizer: Tokenizer,
    *,
    window_tokens: int = 512,
    query_fraction: float = 1 / 8,
    max_windows: int | None = None,
) -> list[EvalWindow]:
    """Non-overlapping windows over each test package's concatenated text (sorted packages)."""
    by_package: dict[str, list[str]] = {}
    for doc in test_docs:
        by_package.setdefault(str(doc.meta.get("package", doc.doc_id)), []).append(doc.text)
    query_tokens = max(1, int(window_tokens * query_fraction))
    windows = []
    for package in sorted(by_package):
        ids = tokenizer.encode("\n\n".join(by_package[package]))
        for start in range(0, len(ids) - window_tokens + 1, window_tokens):
            window = tuple(ids[start : start + window_tokens])
            windows.append(EvalWindow(package=package, ids=window, query_tokens=query_tokens))
            if max_windows is not None and len(windows) >= max_windows:
                return windows
    return windows
