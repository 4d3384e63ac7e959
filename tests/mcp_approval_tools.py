"""Tools that need a person's approval, for test_mcp_approval.py.

Each run appends a line to the file named by TOOLEXEC_TEST_APPROVAL_LOG, so a test
can count how many times a body really ran.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolexec import tool
from toolexec.policies import ApprovalPolicy


def _ran(note: str) -> None:
    with Path(os.environ["TOOLEXEC_TEST_APPROVAL_LOG"]).open("a") as out:
        out.write(note + "\n")


@tool(
    side_effects=True,
    queue="mcp_approval",
    approval=ApprovalPolicy(timeout_s=50.0, poll_s=0.2, prompt="Send the transfer?"),
)
def transfer(amount: int, note: str) -> str:
    """Sends money; a person approves each call first."""
    _ran(note)
    return f"sent {amount}"


@tool(side_effects=True, queue="mcp_approval", approval=ApprovalPolicy(timeout_s=1.5, poll_s=0.2))
def quick_transfer(note: str) -> str:
    """Sends money if someone approves within a second and a half."""
    _ran(note)
    return "sent"
