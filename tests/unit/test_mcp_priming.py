"""Which requests the SDK sees with the session's negotiated protocol (SSE priming)."""

from __future__ import annotations

import json

import pytest

from toolexec.mcp.priming import NegotiatedVersion, answer_version, presented_version, with_version


@pytest.mark.parametrize(
    ("declared", "negotiated", "presented"),
    [
        ("2025-03-26", "2025-11-25", "2025-11-25"),  # the suite's raw polling request
        (None, "2025-11-25", "2025-11-25"),  # no header counts as 2025-03-26
        ("2025-11-25", "2025-11-25", None),  # already primed by the SDK
        ("2025-03-26", "2025-06-18", None),  # an older session never gets priming
        ("2025-03-26", None, None),  # negotiated version unknown
        ("2026-07-28", "2025-11-25", None),  # sessionless protocol: the SDK's routing
        ("garbage", "2025-11-25", None),  # the SDK refuses it
        ("2025-03-26", "2099-01-01", None),  # not a handshake-era version
    ],
)
def test_only_a_session_that_negotiated_priming_is_presented_with_it(
    declared: str | None, negotiated: str | None, presented: str | None
) -> None:
    assert presented_version(declared, negotiated) == presented


def test_the_header_is_replaced_not_added() -> None:
    scope = {"headers": [(b"mcp-protocol-version", b"2025-03-26"), (b"accept", b"x")]}
    headers = with_version(scope, "2025-11-25")["headers"]
    assert sorted(headers) == [(b"accept", b"x"), (b"mcp-protocol-version", b"2025-11-25")]
    assert with_version(scope, "2025-06-18") is scope


def test_the_negotiated_version_is_read_from_json_and_from_sse_in_chunks() -> None:
    answer = {"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25"}}
    assert answer_version(json.dumps(answer).encode()) == "2025-11-25"
    sse = f"id: 1\nretry: 1000\ndata: \n\nevent: message\ndata: {json.dumps(answer)}\n\n"
    reader = NegotiatedVersion()
    for i in range(0, len(sse), 7):
        reader.feed(sse[i : i + 7].encode())
    assert reader.version == "2025-11-25"
    assert answer_version(b'{"jsonrpc": "2.0", "id": 0, "error": {}}') is None
