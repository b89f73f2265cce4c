"""The first-party plugins and integrations import only the public surface.

``agentcompact.plugins`` and ``agentcompact.integrations`` are written as a third party
would write them: every ``import`` of the rest of the package names a public module
(no ``_x`` part) and only names that module lists in ``__all__`` (pinned in
``test_exported_members.PUBLIC``), or a public submodule. What they miss goes into the
public surface (``agentcompact.extending``, ``agentcompact.wire``), never a private import.
Their own private modules (``integrations/_hosts.py``…) they may share among themselves.
Imports are read with :mod:`ast`, relative ones resolved, so none hides from the check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.core.test_exported_members import MODULES, PUBLIC, ROOTS, is_private

#: the packages held to the public surface (they may import their own modules freely)
SELF_CONTAINED = ("agentcompact.plugins", "agentcompact.integrations")


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0]


def _own(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in SELF_CONTAINED)


def _imports(module: str, source: str, path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` of every import of ``source``, relative ones resolved
    (``names`` empty for ``import x.y``)."""
    found: list[tuple[int, str, list[str]]] = []
    package = _package_of(module, path).split(".")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            found.append((node.lineno, base, [alias.name for alias in node.names]))
    return found


def violations(module: str, source: str, path: Path) -> list[str]:
    """Each import of ``module``'s ``source`` that reaches past the public surface."""
    bad = []
    for line, target, names in _imports(module, source, path):
        if target.split(".")[0] != "agentcompact" or _own(target):
            continue
        where = f"{path.name}:{line}"
        if is_private(target) or target not in PUBLIC:
            bad.append(f"{where} imports private module {target}")
            continue
        for name in names:
            sub = f"{target}.{name}"
            if name in PUBLIC[target] or (sub in PUBLIC and not is_private(sub)):
                continue
            if name == "__version__":
                continue
            bad.append(f"{where} imports {target}.{name}, which is not in its __all__")
    return bad


def _first_party() -> list[str]:
    return sorted(m for m in MODULES if _own(m))


def test_the_check_sees_every_first_party_module() -> None:
    found = _first_party()
    assert "agentcompact.plugins.recorder" in found
    assert "agentcompact.integrations.proxy._app" in found
    assert all(MODULES[m].is_relative_to(ROOTS[m.split(".")[0] + "." + m.split(".")[1]])
               for m in found)


@pytest.mark.parametrize("module", _first_party())
def test_first_party_module_imports_only_public_names(module: str) -> None:
    path = MODULES[module]
    assert violations(module, path.read_text(), path) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from .._engine import Engine", "imports private module agentcompact._engine"),
    ("from ..dialects._base import Dialect", "imports private module agentcompact.dialects._base"),
    ("from agentcompact._tokens import make_counter", "private module agentcompact._tokens"),
    ("import agentcompact._redact", "imports private module agentcompact._redact"),
    ("from agentcompact import _engine", "imports agentcompact._engine, which is not in"),
    ("from agentcompact.dialects import _base", "imports agentcompact.dialects._base, which"),
    ("from agentcompact.wire import _sampled", "imports agentcompact.wire._sampled, which"),
    ("def f():\n    from agentcompact.trajectory._tokenize import ChatTokenizer",
     "imports private module agentcompact.trajectory._tokenize"),
])
def test_a_private_import_is_reported(source: str, expected: str) -> None:
    path = ROOTS["agentcompact.integrations"] / "langgraph.py"
    found = violations("agentcompact.integrations.langgraph", source, path)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("source", [
    "from agentcompact import Engine, hookimpl",
    "from agentcompact.extending import new_id",
    "from agentcompact.wire import reassembler",
    "from ..errors import ConfigError",
    "from ._options import engine_from_options",
    "from .proxy._wire import dialect_for",
    "from agentcompact import stores",
])
def test_a_public_or_own_import_passes(source: str) -> None:
    path = ROOTS["agentcompact.integrations"] / "sdk.py"
    assert violations("agentcompact.integrations.sdk", source, path) == []
