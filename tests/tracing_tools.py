"""Tools of the tracing tests (tests/integration/test_tracing.py), on a worker of their own."""

from __future__ import annotations

from typing import Annotated, Any

import httpx

from toolexec import tool
from toolexec.fallback import Explain
from toolexec.policies import BreakerPolicy
from toolexec.redaction import Secret

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=5, max_attempts=4, backoff_base=0.05, backoff_cap=0.1, breaker=NO_BREAKER)
def tr_fetch(url: str, token: Annotated[str, Secret]) -> httpx.Response:
    """GET a URL with the tool's own httpx client; 503s are retried by the executor."""
    with httpx.Client(timeout=5) as client:
        return client.get(url, headers={"Authorization": f"Bearer {token}"})


@tool(
    timeout=5,
    max_attempts=1,
    breaker=NO_BREAKER,
    fallbacks=[Explain(instead="Say the service is down.")],
)
def tr_down(url: str) -> Any:
    """Fails, so that its fallback chain answers."""
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(timeout=5, max_attempts=1, side_effects=True, breaker=NO_BREAKER)
def tr_write(order: str) -> dict[str, Any]:
    """A write: a repeat with the same idempotency key is answered from its record."""
    return {"order": order, "written": True}


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER, payload_threshold_bytes=1024)
def tr_big(size: int) -> str:
    """A result past its 1 KB threshold: stored and passed by reference."""
    return "x" * size
