"""The tools the dashboard preview drives (docs/deploy/preview/render.py): a search that
sometimes gets a 503, an inventory service that fails for a while (its breaker opens and
its fallback answers), and a report too large to travel inline."""

from __future__ import annotations

from typing import Any

import httpx

from toolexec import tool
from toolexec.fallback import Explain
from toolexec.policies import BreakerPolicy

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=5, max_attempts=3, backoff_base=0.05, backoff_cap=0.3, breaker=NO_BREAKER)
def pv_search(url: str) -> Any:
    """Search; the service answers 503 now and then."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(
    timeout=5,
    max_attempts=2,
    backoff_base=0.05,
    backoff_cap=0.2,
    breaker=BreakerPolicy(consecutive_failures=4, failure_rate=None, open_s=8.0),
    fallbacks=[Explain(instead="Say the stock level is unknown right now.")],
)
def pv_inventory(url: str) -> Any:
    """Stock levels; the service goes down for a while during the run."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER)
def pv_report(size: int) -> str:
    """A report too large for a message: it is stored and passed by reference."""
    return "line of a report\n" * (size // 17)
