"""Lua scripts live as ``.lua`` files beside this module, loaded by name.

Each script that takes the time as ``ARGV[1]`` ('' meaning Redis ``TIME``) starts
with ``prelude.lua``: one definition of ``clock`` and ``fmt`` instead of a copy in
every module. Redis ``TIME`` is the fleet's one clock, so hosts' skew cannot stretch
or shorten a lease, a breaker's open time or a budget window; tests pass the time
from an injected clock instead. Numbers go back as ``'%.17g'`` strings because
Redis truncates Lua numbers to integers on the way out.

Lua has no ``require`` inside Redis, so a family of scripts that shares helpers
(the breaker's ``load``, ``save``, ``verdict``) keeps them in one file that is
joined in front of each script: ``script_source("breaker", "breaker_check")``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["script_source"]


@cache
def _read(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def script_source(*names: str, prelude: bool = True) -> str:
    """The text of each ``<name>.lua`` in order, after the shared prelude unless ``prelude``
    is False."""
    if not names:
        raise ValueError("name at least one script")
    parts = [_read(name) for name in names]
    return "\n".join([_read("prelude"), *parts] if prelude else parts)
