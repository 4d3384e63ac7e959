"""What bench/idempotency.py runs: no-ops with and without side effects, and ledger writes.

The two no-ops differ only in ``side_effects``, so the difference between
their round trips is what idempotency costs. The order tools write to a
FlakyServer path (the write lands when the request arrives) and check it.
"""

from __future__ import annotations

from typing import Any

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy

#: The breaker's own scripts would add the same work to both sides; leave them out.
NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=60, max_attempts=1, breaker=NO_BREAKER)
def idem_read() -> None:
    """A read-only no-op: the baseline."""


@tool(timeout=60, max_attempts=1, side_effects=True, breaker=NO_BREAKER)
def idem_write() -> None:
    """A side-effecting no-op: claims and stores an idempotency record."""


def order_placed(order_id: str, ledger: str, prepare: str | None = None) -> bool:
    """Did the ledger receive this order?"""
    with httpx.Client(timeout=10) as client:
        response = client.get(f"{ledger}/{order_id}/exists")
        response.raise_for_status()
    return bool(response.json().get("exists"))


@tool(timeout=60, max_attempts=2, side_effects=True, check=order_placed, breaker=NO_BREAKER)
def idem_order(order_id: str, ledger: str, prepare: str | None = None) -> dict[str, Any]:
    """A slow read (``prepare``), then a write to the ledger."""
    with httpx.Client(timeout=60) as client:
        if prepare:
            client.get(prepare).raise_for_status()
        client.post(f"{ledger}/{order_id}").raise_for_status()
    return {"order_id": order_id, "written": True}
