"""Lua scripts live as ``.lua`` files beside this module, loaded by name.

Each script that takes the time as ``ARGV[1]`` ('' meaning Redis ``TIME``) starts
with ``prelude.lua``: one definition of ``clock`` and ``fmt`` instead of a copy in
every module. Redis ``TIME`` is the fleet's one clock, so hosts' skew cannot stretch
or shorten a lease, a breaker's open time or a budget window; tests pass the time
from an injected clock instead. Numbers go back as ``'%.17g'`` strings because
Redis truncates Lua numbers to integers on the way out.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["script_source"]


@cache
def _read(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def script_source(name: str, *, prelude: bool = True) -> str:
    """The text of ``<name>.lua``, after the shared prelude unless ``prelude`` is False."""
    body = _read(name)
    return _read("prelude") + "\n" + body if prelude else body
