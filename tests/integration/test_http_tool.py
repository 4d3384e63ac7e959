"""The built-in ``http_request`` tool against the misbehaving service; its results for models."""

from __future__ import annotations

import json

import pytest

from toolexec.client import ToolClient
from toolexec.errors import ErrorType
from toolexec.testing import FlakyServer, Reply

pytestmark = pytest.mark.integration


def test_200_returns_status_kept_headers_and_json_body(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a 200 JSON answer, the model gets the status, the useful headers and the body."""
    path = flaky.unique_path("http-ok")
    body = {"items": [1, 2, 3], "next": None}
    url = flaky.script(path, Reply(200, body, headers={"ETag": '"v7"', "X-Noise": "drop me"}))

    result = client.call("http_request", {"url": url, "params": {"q": "x"}}, timeout=20)

    assert result.status == "ok", result
    assert result.attempts == 1
    assert result.data["status"] == 200
    assert result.data["json"] == body
    assert result.data["headers"]["etag"] == '"v7"'
    assert result.data["headers"]["content-type"] == "application/json"
    assert "x-noise" not in result.data["headers"]
    [hit] = flaky.hits(path)
    assert (hit.method, hit.query) == ("GET", "q=x")


def test_503_then_200_is_ok_after_two_attempts(client: ToolClient, flaky: FlakyServer) -> None:
    """Given one 503 before a 200, http_request retries once and succeeds."""
    path = flaky.unique_path("http-503")
    url = flaky.script(path, Reply(503), Reply(200, {"up": True}))

    result = client.call("http_request", {"url": url}, timeout=20)

    assert result.status == "ok", result
    assert result.data["json"] == {"up": True}
    assert result.attempts == 2
    assert len(flaky.hits(path)) == 2


def test_404_is_not_found_and_renders_for_both_model_apis(
    client: ToolClient, flaky: FlakyServer
) -> None:
    """Given a 404, the result is not_found, and both API renderings carry type and advice."""
    path = flaky.unique_path("http-404")
    url = flaky.script(path, Reply(404, {"detail": "no such order"}))

    result = client.call("http_request", {"url": url}, timeout=20)

    assert result.error is not None
    assert result.error.type == ErrorType.NOT_FOUND
    assert result.attempts == 1
    assert len(flaky.hits(path)) == 1
    openai = result.to_openai_message("call_abc")
    anthropic = result.to_anthropic_block("toolu_abc")
    assert (openai["role"], openai["tool_call_id"]) == ("tool", "call_abc")
    assert (anthropic["type"], anthropic["tool_use_id"]) == ("tool_result", "toolu_abc")
    assert anthropic["is_error"] is True
    for content in (openai["content"], anthropic["content"]):
        error = json.loads(content)["error"]
        assert error["type"] == "not_found"
        assert error["suggestion"] == result.error.suggestion
        assert "no such order" in error["message"]
