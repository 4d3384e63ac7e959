"""The public API is what ``__all__`` says, no more and no less."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import toolexec

SUBMODULES = sorted(
    f"toolexec.{info.name}"
    for info in pkgutil.iter_modules(toolexec.__path__)
    if info.name != "__main__"  # importing it runs the CLI
)


def test_every_name_in_all_is_importable() -> None:
    missing = [name for name in toolexec.__all__ if not hasattr(toolexec, name)]
    assert missing == []


def test_every_public_name_of_the_package_is_in_all() -> None:
    public = {
        name
        for name, value in vars(toolexec).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(toolexec.__all__)


def test_all_is_sorted_without_duplicates() -> None:
    assert toolexec.__all__ == sorted(set(toolexec.__all__))


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from toolexec import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(toolexec.__all__)


@pytest.mark.parametrize("name", toolexec.__all__)
def test_each_export_is_public_where_it_is_defined(name: str) -> None:
    """The package re-exports; it never promotes a private name of a submodule."""
    value = getattr(toolexec, name)
    home = importlib.import_module(value.__module__)
    assert home.__name__.startswith("toolexec.")
    assert getattr(home, name) is value
    assert name in home.__all__


@pytest.mark.parametrize("module_name", SUBMODULES)
def test_each_submodule_declares_all_and_every_name_in_it_exists(module_name: str) -> None:
    module = importlib.import_module(module_name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{module_name} has no __all__"
    assert [name for name in declared if not hasattr(module, name)] == []
