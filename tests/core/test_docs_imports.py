"""The README and docs/ show only the public surface: every ``import`` in their code
examples names a public module (no ``_x`` part) and only names its ``__all__`` lists (or a
public submodule), and every ``python -m agentcompact...`` runs a public module."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.core.test_exported_members import MODULES, PUBLIC

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
FROM = re.compile(rf"^\s*(?:>>>\s*)?from\s+(agentcompact(?:\.{IDENT})*)\s+import\s+"
                  rf"(\([^)]*\)|[^\n#;]*)", re.M)
IMPORT = re.compile(rf"^\s*(?:>>>\s*)?import\s+(agentcompact(?:\.{IDENT})*)", re.M)
RUN_MODULE = re.compile(rf"python3?\s+-m\s+(agentcompact(?:\.{IDENT})*)")


def _examples(page: Path) -> str:
    return "\n".join(FENCE.findall(page.read_text()))


def _names(spec: str) -> list[str]:
    spec = "\n".join(line.partition("#")[0] for line in spec.strip("()").splitlines())
    return [part.split(" as ")[0].strip() for part in spec.split(",") if part.strip()]


def test_pages_are_found() -> None:
    assert len(PAGES) > 10 and all(p.exists() for p in PAGES)
    assert sum(len(FROM.findall(_examples(p))) for p in PAGES) > 30


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_examples_import_only_public_names(page: Path) -> None:
    text = _examples(page)
    for module, spec in FROM.findall(text):
        assert module in PUBLIC, f"{page.name}: from {module} import ... (not public)"
        for name in _names(spec):
            assert name in PUBLIC[module] or f"{module}.{name}" in PUBLIC, \
                f"{page.name}: from {module} import {name} ({name} is not in its __all__)"
    for module in IMPORT.findall(text):
        assert module in PUBLIC, f"{page.name}: import {module} (not public)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_m_runs_public_modules(page: Path) -> None:
    for module in RUN_MODULE.findall(page.read_text()):
        runnable = module in MODULES and (f"{module}.__main__" in MODULES
                                          or not MODULES[module].name == "__init__.py")
        assert module in PUBLIC and runnable, f"{page.name}: python -m {module}"
