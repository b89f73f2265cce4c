"""Every public exception of the package is defined in ``agentcompact.errors`` and derives
from ``AgentCompactError`` (so ``except AgentCompactError`` catches all of them, and
catching the engine's tool-pairing ``ValidationError`` never catches an export error)."""

from __future__ import annotations

import importlib

import pytest

from agentcompact import errors
from tests.core.test_exported_members import PUBLIC


def _import(name: str) -> object | None:
    try:
        return importlib.import_module(name)
    except ImportError:  # a module of an extra that is not installed
        return None


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_exceptions_are_defined_in_errors(name: str) -> None:
    module = _import(name)
    if module is None:
        pytest.skip(f"{name}: its extra is not installed")
    for attr in getattr(module, "__all__", ()):
        value = getattr(module, attr)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert value.__module__ == "agentcompact.errors", f"{name}.{attr}"
            assert issubclass(value, errors.AgentCompactError), f"{name}.{attr}"


def test_errors_exports_every_class_it_defines() -> None:
    defined = {n for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, BaseException)
               and v.__module__ == errors.__name__}
    assert defined == set(errors.__all__)


def test_export_errors_are_not_tool_pairing_errors() -> None:
    assert not issubclass(errors.ExportError, errors.ValidationError)
    assert issubclass(errors.SegmentRowError, errors.ExportError)
    assert issubclass(errors.UpstreamError, errors.ProxyError)
