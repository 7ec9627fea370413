"""docs/operator.md's module table names every module of kvpilot/operator, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = ROOT / "kvpilot" / "operator"


def _documented() -> set[str]:
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_/]+\.py)` \|", section, flags=re.M))


def _modules() -> set[str]:
    return {
        str(p.relative_to(OPERATOR))
        for p in OPERATOR.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }


def test_every_operator_module_is_in_the_table() -> None:
    missing = sorted(_modules() - _documented())
    assert not missing, f"docs/operator.md, 'Modules', lacks {missing}"


def test_the_table_names_no_module_that_does_not_exist() -> None:
    stale = sorted(_documented() - _modules())
    assert not stale, f"docs/operator.md, 'Modules', names modules that do not exist: {stale}"
