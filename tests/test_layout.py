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
