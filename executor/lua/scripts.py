"""Reading the ``.lua`` files of this package, the shared prelude first.

Lua has no ``require`` inside Redis, so a family of scripts that shares helpers
(the breaker's ``load``, ``save``, ``verdict``) keeps them in one file that is
joined in front of each script: ``script_source("breaker", "breaker_check")``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["script_source"]

#: The package whose data files the scripts are (see pyproject's package-data).
_PACKAGE = "toolexec.lua"


@cache
def _read(name: str) -> str:
    return resources.files(_PACKAGE).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def script_source(*names: str, prelude: bool = True) -> str:
    """The named ``.lua`` files joined in order, after ``prelude.lua`` unless told not to."""
    if not names:
        raise ValueError("script_source needs the name of at least one script")
    parts = [_read(name) for name in names]
    return "\n".join([_read("prelude"), *parts] if prelude else parts)
