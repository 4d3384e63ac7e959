"""A remote MCP server (tests/integration/mcp_remote_server.py) proxied by a worker.

The test passes the server's URL in the environment; the worker lists its tools
when it starts and registers each as ``remote.<tool>``, and again as
``shaky.<tool>``: the same server under a second name, with a breaker of its
own that trips quickly, so the breaker test cannot disturb the others.
"""

from __future__ import annotations

import os

from toolexec.fallback.steps import LastGood
from toolexec.mcp import mcp_server
from toolexec.policies import BreakerPolicy

QUEUE = "mcp_proxy"

mcp_server(
    "remote",
    os.environ["TOOLEXEC_TEST_MCP_URL"],
    timeout=5.0,
    max_attempts=3,
    backoff_base=0.05,
    backoff_cap=0.2,
    queue=QUEUE,
    breaker=BreakerPolicy(consecutive_failures=50, failure_rate=None),
    fallbacks={"echo": [LastGood(ttl_s=600)]},
)

mcp_server(
    "shaky",
    os.environ["TOOLEXEC_TEST_MCP_URL"],
    timeout=5.0,
    max_attempts=1,
    queue=QUEUE,
    breaker=BreakerPolicy(consecutive_failures=2, failure_rate=None, open_s=60.0),
)
