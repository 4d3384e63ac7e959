"""Tools the idempotency tests run on their own workers, against a FlakyServer "ledger".

A write is a POST to ``<ledger>/<order id>``: the FlakyServer records the hit
when the request arrives, before its scripted delay, so the effect exists even
if the worker never hears back. A check is a GET of ``<ledger>/<order id>/exists``,
which the test scripts to answer from the hits the service has recorded.

Queue ``idem`` is served by the module's shared worker; queue ``idem_crash`` only
by the workers the crash tests start and kill.
"""

from __future__ import annotations

from typing import Any

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy

#: Some calls here fail on purpose; a breaker opened by one test must not refuse the next.
NO_BREAKER = BreakerPolicy(enabled=False)
FAST_RETRY: dict[str, Any] = {"backoff_base": 0.05, "backoff_cap": 0.1, "breaker": NO_BREAKER}


def _write(order_id: str, amount: float, ledger: str, prepare: str | None) -> dict[str, Any]:
    """An optional slow read first (``prepare``), then the write itself."""
    with httpx.Client(timeout=60) as client:
        if prepare:
            client.get(prepare).raise_for_status()
        response = client.post(f"{ledger}/{order_id}", json={"amount": amount})
        response.raise_for_status()
    return {"order_id": order_id, "amount": amount, "written": True}


def _exists(order_id: str, ledger: str) -> dict[str, Any] | bool:
    with httpx.Client(timeout=5) as client:
        response = client.get(f"{ledger}/{order_id}/exists")
        response.raise_for_status()
    found: dict[str, Any] = response.json()
    return {"order_id": order_id, "found": True} if found.get("exists") else False


def order_placed(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any] | bool:
    """The check of the order tools: did the ledger receive this order?"""
    return _exists(order_id, ledger)


@tool(queue="idem", side_effects=True, check=order_placed, timeout=20, **FAST_RETRY)
def place_order(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any]:
    """Place an order (a write with a check)."""
    return _write(order_id, amount, ledger, prepare)


@tool(queue="idem", side_effects=True, timeout=1, max_attempts=3, **FAST_RETRY)
def place_order_blind(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any]:
    """Place an order; no check, and only a second to do it."""
    return _write(order_id, amount, ledger, prepare)


@tool(
    queue="idem",
    side_effects=True,
    check=order_placed,
    timeout=1,
    max_attempts=3,
    **FAST_RETRY,
)
def place_order_hastily(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any]:
    """Place an order with a check, and only a second to do it."""
    return _write(order_id, amount, ledger, prepare)


@tool(queue="idem", coalesce=True, timeout=10, **FAST_RETRY)
def read_stock(url: str) -> Any:
    """A read-only lookup; identical ones in flight share one request."""
    with httpx.Client(timeout=10) as client:
        response = client.get(url)
        response.raise_for_status()
        return response.json()


@tool(queue="idem_crash", side_effects=True, check=order_placed, timeout=40, **FAST_RETRY)
def crash_order(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any]:
    """Like place_order, on the queue of the workers the crash tests kill."""
    return _write(order_id, amount, ledger, prepare)


@tool(queue="idem_crash", side_effects=True, timeout=40, **FAST_RETRY)
def crash_order_blind(
    order_id: str, amount: float, ledger: str, prepare: str | None = None
) -> dict[str, Any]:
    """Like crash_order, without a check."""
    return _write(order_id, amount, ledger, prepare)


@tool(queue="idem_crash", timeout=10, **FAST_RETRY)
def crash_read(url: str) -> Any:
    """A plain read-only tool on the crash workers' queue: it holds a lease like every call."""
    with httpx.Client(timeout=10) as client:
        return client.get(url).json()
