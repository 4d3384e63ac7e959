"""The public API is what ``__all__`` says, no more and no less."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

import toolexec

#: Every module under toolexec's own folder, subpackages' modules included.
SUBMODULES = sorted(
    info.name for info in pkgutil.walk_packages(toolexec.__path__, prefix="toolexec.")
)
SUBPACKAGES = sorted(
    info.name for info in pkgutil.walk_packages(toolexec.__path__, prefix="toolexec.") if info.ispkg
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


@pytest.mark.parametrize("package_name", SUBPACKAGES)
def test_a_subpackage_init_only_re_exports_its_own_modules(package_name: str) -> None:
    """An __init__ defines nothing: each name comes from a module of the package."""
    package = importlib.import_module(package_name)
    exported = package.__all__
    assert exported == sorted(set(exported))
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(exported)
    modules = [importlib.import_module(m) for m in SUBMODULES if m.startswith(package_name + ".")]
    for name in exported:
        value = getattr(package, name)
        homes = [m for m in modules if name in m.__all__ and getattr(m, name) is value]
        assert homes, f"{package_name}.{name} is not a public name of one of its modules"
