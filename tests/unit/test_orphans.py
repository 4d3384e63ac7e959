"""When a watcher may call a consumer dead, and which ones it calls dead."""

from __future__ import annotations

import pytest

from toolexec.transport.orphans import dead_consumers, may_judge


def test_no_judgement_before_one_alive_ttl_of_connection() -> None:
    assert not may_judge(now=104.9, connected_since=100.0, alive_ttl_s=5.0)
    assert may_judge(now=105.0, connected_since=100.0, alive_ttl_s=5.0)


def test_no_judgement_while_disconnected() -> None:
    assert not may_judge(now=1e9, connected_since=None, alive_ttl_s=5.0)


def test_only_silent_others_are_dead() -> None:
    members = ["a", "b", "me", "c"]
    assert dead_consumers(members, [True, False, False, False], "me") == ["b", "c"]


def test_flags_must_match_members() -> None:
    with pytest.raises(ValueError):
        dead_consumers(["a", "b"], [True], "me")
