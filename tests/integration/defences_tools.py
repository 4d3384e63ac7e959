"""Tools only test_defences_adapt's workers import, on a queue nobody else consumes.

Every policy is the default but ``max_attempts`` (4, as a user would set it): the
point is that the defaults tell a blip from an outage. Each tool has its own breaker
and retry budget, so the two scenarios cannot disturb each other.
"""

from __future__ import annotations

import httpx

from toolexec import tool

QUEUE = "defences"


def _get(url: str) -> httpx.Response:
    with httpx.Client(timeout=5) as client:
        return client.get(url)


@tool(max_attempts=4, queue=QUEUE)
def blip_fetch(url: str) -> httpx.Response:
    """GET a URL whose service fails each call once."""
    return _get(url)


@tool(max_attempts=4, queue=QUEUE)
def outage_fetch(url: str) -> httpx.Response:
    """GET a URL whose service is down."""
    return _get(url)
