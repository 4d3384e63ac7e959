"""Lua scripts live as ``.lua`` files in this package, loaded by name.

Each script that takes the time as ``ARGV[1]`` ('' meaning Redis ``TIME``) starts
with ``prelude.lua``: one definition of ``clock`` and ``fmt`` instead of a copy in
every module. Redis ``TIME`` is the fleet's one clock, so hosts' skew cannot stretch
or shorten a lease, a breaker's open time or a budget window; tests pass the time
from an injected clock instead. Numbers go back as ``'%.17g'`` strings because
Redis truncates Lua numbers to integers on the way out.
"""

from toolexec.lua.scripts import SlotScript, register, script_source

__all__ = ["SlotScript", "register", "script_source"]
