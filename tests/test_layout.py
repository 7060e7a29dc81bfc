"""docs/layout.md stays true: every package and top-level module of tandem/ is in its tree, and
everything its tree names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tree() -> set[str]:
    text = (ROOT / "docs" / "layout.md").read_text()
    block = text.split("```")[1]
    return set(re.findall(r"^  (\w+(?:\.py|/))", block, flags=re.M))


def test_layout_lists_every_package_and_module():
    actual = {
        p.name + "/" if p.is_dir() else p.name
        for p in (ROOT / "tandem").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert actual == _tree()


def test_layout_names_the_model_backends():
    text = (ROOT / "docs" / "layout.md").read_text()
    for module in (ROOT / "tandem" / "models").glob("*.py"):
        if module.stem != "__init__":
            assert re.search(rf"\b{module.stem}\b", text), f"models/{module.name} not in layout"


def _section(text: str, name: str) -> str:
    return text.split(f"<!-- {name} -->")[1].split(f"<!-- /{name} -->")[0]


def _imports(path: Path):
    """(line, imported module) of every absolute tandem import in `path`, at any depth."""
    import ast

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_imports_run_down_the_layers():
    text = (ROOT / "docs" / "layout.md").read_text()
    order = [name.strip() for name in _section(text, "layers").strip().split(",")]
    rank = {name: i for i, name in enumerate(order)}
    allowed = set(re.findall(r"^- (\S+) -> (\S+):", _section(text, "exceptions"), flags=re.M))
    packages = {
        p.name.removesuffix(".py")
        for p in (ROOT / "tandem").iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    assert packages == set(order), "the layer list must name every package and module of tandem/"
    found: set[tuple[str, str]] = set()
    upward = []
    for path in sorted((ROOT / "tandem").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        parts = path.relative_to(ROOT / "tandem").parts
        if len(parts) == 1 and parts[0] == "__init__.py":
            continue
        here = parts[0].removesuffix(".py")
        for line, module in _imports(path):
            names = module.split(".")
            if names[0] != "tandem" or len(names) < 2 or names[1] == here:
                continue
            if rank[names[1]] > rank[here]:
                key = (rel, f"tandem.{names[1]}")
                found.add(key)
                if key not in allowed:
                    upward.append(f"{rel}:{line} imports {module} ({here} is below {names[1]})")
    assert not upward, "imports against docs/layout.md's layers:\n" + "\n".join(upward)
    stale = allowed - found
    assert not stale, f"listed as exceptions but no longer in the code (remove them): {stale}"


def test_the_library_never_imports_the_benchmarks():
    """`benchmarks/` sits above every layer: nothing in tandem/ imports it (at any depth),
    and only tests/bench/ of the tests does; the CLI finds it by entry point."""
    offenders = []
    for top, allowed in (("tandem", ()), ("tests", ("tests/bench/",))):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(allowed):
                continue
            offenders += [
                f"{rel}:{line} imports {module}"
                for line, module in _imports(path)
                if module.split(".")[0] == "benchmarks"
            ]
    assert not offenders, "the library and its tests must not import benchmarks:\n" + "\n".join(
        offenders
    )


def test_long_modules_say_why_at_the_top():
    """No module of tandem/ over ~400 lines without a reason stated in its docstring."""
    import ast

    unexplained = []
    for path in sorted((ROOT / "tandem").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 400:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "Why one file:" not in doc:
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not unexplained, "long modules need a 'Why one file:' paragraph:\n" + "\n".join(
        unexplained
    )
