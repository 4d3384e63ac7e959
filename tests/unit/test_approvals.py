"""The decisions of human approval: what a parked call does, what an answer means."""

from __future__ import annotations

import pytest

from toolexec.errors import ConfigurationError, ErrorType
from toolexec.fallback.state import falls_back
from toolexec.layers.approvals import Pending, ruling
from toolexec.mcp.relay import approval_decision
from toolexec.policies import ApprovalPolicy
from toolexec.registry import Registry, tool
from toolexec.results import ErrorInfo

POLICY = ApprovalPolicy(timeout_s=10.0, poll_s=1.0)
PENDING = Pending("c1", "transfer", {"amount": 5}, "run-1", "ok?", 100.0, 110.0)


def test_a_decision_settles_the_call_whatever_the_time() -> None:
    assert ruling({"decision": "approved"}, PENDING, POLICY, 500.0) == "run"
    assert ruling({"decision": "denied"}, PENDING, POLICY, 101.0) == "denied"
    assert ruling({"decision": "something else"}, PENDING, POLICY, 101.0) == "denied"


def test_without_a_decision_the_call_waits_until_its_window_closes() -> None:
    assert ruling(None, PENDING, POLICY, 100.0) == "wait"
    assert ruling(None, PENDING, POLICY, 108.9) == "wait"
    # the next look would come after the window: end now rather than park again
    assert ruling(None, PENDING, POLICY, 109.0) == "timeout"


def test_only_an_explicit_yes_approves() -> None:
    assert approval_decision("accept", {"approve": True}) == "approved"
    assert approval_decision("accept", {"approve": "yes"}) == "denied"
    assert approval_decision("accept", None) == "denied"
    assert approval_decision("decline", None) == "denied"
    assert approval_decision("cancel", None) is None  # an operator may still decide


def test_approval_outcomes_never_fall_back_to_another_tool() -> None:
    for kind in (ErrorType.APPROVAL_DENIED, ErrorType.APPROVAL_TIMEOUT):
        assert not falls_back(ErrorInfo(type=kind, message="no"))


def test_the_policy_is_published_and_checked() -> None:
    registry = Registry()

    @tool(approval=True, side_effects=True, registry=registry)
    def pay(amount: int) -> str:
        return "paid"

    entry = registry.get("pay").catalog_entry("tools")
    assert entry["policy"]["approval"] == {"timeout_s": 300.0, "poll_s": 1.0, "prompt": None}
    with pytest.raises(ConfigurationError):
        ApprovalPolicy(timeout_s=0)
    with pytest.raises(ConfigurationError):
        ApprovalPolicy(poll_s=float("nan"))
