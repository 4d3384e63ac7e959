"""A remote MCP server (tests/integration/mcp_remote_server.py) proxied by a worker.

The test passes the server's URL in the environment; the worker lists its tools
when it starts and registers each as ``remote.<tool>``.
"""

from __future__ import annotations

import os

from toolexec.breaker import BreakerPolicy
from toolexec.fallback.steps import LastGood
from toolexec.mcp.remote import mcp_server

mcp_server(
    "remote",
    os.environ["TOOLEXEC_TEST_MCP_URL"],
    timeout=5.0,
    max_attempts=3,
    backoff_base=0.05,
    backoff_cap=0.2,
    breaker=BreakerPolicy(consecutive_failures=4, failure_rate=None, open_s=30.0),
    fallbacks={"echo": [LastGood(ttl_s=600)]},
)
