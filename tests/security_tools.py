"""Tools of the security tests: one takes a secret argument, one just answers."""

from __future__ import annotations

from typing import Annotated

import httpx

from toolexec import tool
from toolexec.policies import BreakerPolicy
from toolexec.redaction import Secret

NO_BREAKER = BreakerPolicy(enabled=False)


@tool(timeout=5, max_attempts=3, backoff_base=0.01, backoff_cap=0.05, breaker=NO_BREAKER)
def sec_login(url: str, user: str, token: Annotated[str, Secret]) -> httpx.Response:
    """Sends the token as a bearer credential; the executor classifies the reply."""
    with httpx.Client(timeout=5) as client:
        return client.post(url, headers={"Authorization": f"Bearer {token}"}, json={"user": user})


@tool(timeout=5, max_attempts=1, breaker=NO_BREAKER)
def sec_echo(text: str) -> str:
    """Answers with its argument: enough to prove a call went through."""
    return text
