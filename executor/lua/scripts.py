"""Reading the ``.lua`` files of this package, the shared prelude first.

Lua has no ``require`` inside Redis, so a family of scripts that shares helpers
(the breaker's ``load``, ``save``, ``verdict``) keeps them in one file that is
joined in front of each script: ``script_source("breaker", "breaker_check")``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.cluster
from redis.commands.core import Script
from redis.typing import EncodableT, KeyT

__all__ = ["SlotScript", "register", "script_source"]

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


class SlotScript(Script):
    """A script that also works queued in a Redis Cluster pipeline.

    redis-py loads a script before a plain pipeline runs it, but not before a
    cluster pipeline does (and Redis 7 does not copy its script cache to the
    replica that a failover promotes), so there an ``EVALSHA`` can meet
    ``NOSCRIPT`` with other commands of the pipeline already done. Queued in a
    cluster pipeline, the script is therefore sent whole (``EVAL``): more bytes,
    never a NOSCRIPT. Everywhere else it is an ordinary :class:`Script`.
    """

    def __call__(
        self,
        keys: Sequence[KeyT] | None = None,
        args: Iterable[EncodableT] | None = None,
        client: Any = None,
    ) -> Any:
        if isinstance(client, redis.cluster.ClusterPipeline):
            keys = list(keys or [])
            # ClusterPipeline blocks evalsha() and leaves eval() unimplemented, but queues
            # the command itself, routed by its keys like any other.
            return client.execute_command("EVAL", self.script, len(keys), *keys, *(args or []))  # type: ignore[no-untyped-call]
        return super().__call__(keys=keys, args=args, client=client)


def register(client: redis.Redis, source: str) -> Script:
    """``client.register_script(source)``, safe in cluster pipelines (:class:`SlotScript`)."""
    return SlotScript(client, source)
