"""Tools only the test's own worker imports, on a queue the shared worker never consumes.

The shared worker consumes every queue of the tools it imports, so a tool
meant for a worker the test can kill has to live outside ``tooldefs``.
"""

from __future__ import annotations

import time

import httpx

from toolexec import tool

QUEUE = "lonely"


@tool(timeout=30, max_attempts=1, queue=QUEUE)
def linger(url: str, seconds: float) -> float:
    """Reports its start to ``url``, then sleeps: a call a test can kill mid-run."""
    with httpx.Client(timeout=5) as client:
        client.post(url)
    time.sleep(seconds)
    return seconds
