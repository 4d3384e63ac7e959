"""Tools that report on the worker process they run in: which Redis pools it holds.

A tool runs inside the worker, so it can look at the process's runtime
(``toolexec.tasks.runtime``) and count the connection pools every store on it
reaches. The test compares that with one pool per process.
"""

from __future__ import annotations

import gc
from typing import Any

import redis

from toolexec import tool
from toolexec.policies import BreakerPolicy
from toolexec.tasks.runtime import runtime_of
from toolexec.worker.app import app

QUEUE = "runtime-pools"
NO_BREAKER = BreakerPolicy(enabled=False)

#: Containers walked through on the way from the runtime to the stores' clients.
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _walked_into(obj: object) -> bool:
    """toolexec's and redis-py's own objects; never the Celery app (its broker
    and backend are not toolexec state), functions, modules or classes."""
    if isinstance(obj, _CONTAINERS):
        return True
    if isinstance(obj, type):
        return False
    return type(obj).__module__.startswith(("toolexec.", "redis."))


def pools_reachable(root: object) -> list[redis.ConnectionPool]:
    """Every Redis connection pool reachable from ``root`` through toolexec's objects."""
    seen: set[int] = set()
    pools: dict[int, redis.ConnectionPool] = {}
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, redis.ConnectionPool):
            pools[id(obj)] = obj
        elif _walked_into(obj):
            stack.extend(gc.get_referents(obj))
    return list(pools.values())


@tool(timeout=30, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def redis_pools() -> dict[str, Any]:
    """Returns how many Redis pools this worker process's runtime reaches."""
    runtime = runtime_of(app)
    pools = pools_reachable(runtime)
    return {
        "pools": len(pools),
        "runtime_pool": any(pool is runtime.redis.connection_pool for pool in pools),
        "layers": [type(layer).__name__ for layer in runtime.executor.layers],
    }


@tool(timeout=30, max_attempts=1, queue=QUEUE, breaker=NO_BREAKER)
def pool_text(lines: int) -> str:
    """Returns ``lines`` numbered lines: enough of them and the result is offloaded."""
    return "".join(f"{i:08d} the quick brown fox jumps over the lazy dog.\n" for i in range(lines))
